// Package splice joins two connections, as a port tunnel or a port
// forward does: bytes both ways, each end of input passed on as a
// half-close.
package splice

import (
	"io"
	"sync"
)

// Conns copies a to b and b to a until both directions have ended, and
// returns the bytes each way. When one side's input ends, the other
// side's writing is closed (CloseWrite) and the other direction goes on,
// so a client that shuts down its writing still reads the answer. An
// error either way, or a side that cannot half-close, closes both.
func Conns(a, b io.ReadWriteCloser) (ab, ba int64) {
	var wg sync.WaitGroup
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			_ = a.Close()
			_ = b.Close()
		})
	}
	half := func(dst io.WriteCloser, src io.Reader, n *int64) {
		defer wg.Done()
		var err error
		*n, err = io.Copy(dst, src)
		cw, ok := dst.(interface{ CloseWrite() error })
		if err != nil || !ok || cw.CloseWrite() != nil {
			closeBoth()
		}
	}
	wg.Add(2)
	go half(b, a, &ab)
	go half(a, b, &ba)
	wg.Wait()
	return ab, ba
}
