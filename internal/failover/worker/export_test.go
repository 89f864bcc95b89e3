package worker

// FenceAfter exposes fenceAfter to the package's external tests.
var FenceAfter = fenceAfter
