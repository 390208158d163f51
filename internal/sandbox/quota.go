package sandbox

import (
	"time"

	"github.com/berth-sandbox/berth/internal/core"
	"github.com/berth-sandbox/berth/internal/quota"
)

// checkQuotaTimeout refuses a lifetime above the owner's max-timeout before
// anything is made.
func checkQuotaTimeout(q core.Quota, d time.Duration) error {
	if err := quota.Timeout(q, d); err != nil {
		return &FieldError{Field: "timeout", Err: err}
	}
	return nil
}

// admitLocked checks a new sandbox of owner against its quota, counting
// every live sandbox of the same owner (those still being created too). It
// runs under m.mu in the same critical section that adds the new entry, so
// concurrent creates cannot both take the last slot.
func (m *Manager) admitLocked(owner string, q core.Quota, l Limits) error {
	if q == (core.Quota{}) {
		return nil
	}
	var used quota.Usage
	for _, e := range m.live {
		st := e.cur.Load()
		if st == nil || st.rec.Owner != owner {
			continue
		}
		used.Add(st.rec.CPUMillis, st.rec.MemoryBytes)
	}
	return quota.Admit(q, used, l.CPUMillis, l.MemoryBytes)
}
