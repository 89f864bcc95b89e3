// Package docscheck owns no code: its tests hold the repository's docs/
// pages to the code, so a setting, problem type or metric added without
// its documentation, or a link that leaves the repository, fails the build.
package docscheck
