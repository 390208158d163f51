package core

// What a pause keeps.
const (
	// PauseMemory: every process and its memory (a checkpoint).
	PauseMemory = "memory"
	// PauseFilesystem: the writable layer, environment, labels, network
	// policy and deadline; processes end and the agent starts again.
	PauseFilesystem = "filesystem"
)

// What a deadline does.
const (
	OnTimeoutKill  = "kill"
	OnTimeoutPause = "pause"
)
