// Package sdktest owns no code: its tests run the client SDKs users run
// (the official openai Node SDK, the Vercel AI SDK, openai-go) against a
// Spillway api in front of a recording mock upstream, and compare each
// with the same SDK call sent straight to the mock (docs/API.md,
// "OpenAI-compatible API"). The Node SDKs and Node 22 come from
// test/sdk's package-lock.json, which `make test` installs.
package sdktest
