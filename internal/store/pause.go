package store

// pauseColumns are the sandboxes columns of pause and resume (issue 14),
// added by migrate after sandboxColumns: how a paused sandbox was paused,
// the time its deadline had left (nanoseconds), what its deadline does,
// and whether it resumes on its next request.
var pauseColumns = []struct{ name, decl string }{
	{"pause_kind", `TEXT NOT NULL DEFAULT ''`},
	{"pause_remaining", `INTEGER NOT NULL DEFAULT 0`},
	{"on_timeout", `TEXT NOT NULL DEFAULT ''`},
	{"auto_resume", `INTEGER NOT NULL DEFAULT 0`},
	{"idle_pause", `INTEGER NOT NULL DEFAULT 0`},
}
