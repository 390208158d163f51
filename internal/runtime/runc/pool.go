package runc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/berth-sandbox/berth/internal/diskimg"
)

// diskPool keeps a few formatted disk images of each recently used size
// ready, so creating a sandbox skips mkfs (~15 ms, more under load). Images
// are plain files in one directory on the same filesystem as the sandboxes'
// state, handed over with a rename; the directory is emptied at start, so
// a crash leaves at most a few spare images that the next start removes.
type diskPool struct {
	dir   string
	depth int
	log   *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	ready   map[int64][]string
	filling map[int64]bool
}

func newDiskPool(dir string, depth int, log *slog.Logger) (*diskPool, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("disk pool: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("disk pool: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &diskPool{dir: dir, depth: depth, log: log, ctx: ctx, cancel: cancel,
		ready: map[int64][]string{}, filling: map[int64]bool{}}, nil
}

// take moves a ready image of size to dst and reports whether it did.
// The caller refills the pool (warm) once it is done with its create.
func (p *diskPool) take(size int64, dst string) bool {
	p.mu.Lock()
	var img string
	if imgs := p.ready[size]; len(imgs) > 0 {
		img = imgs[len(imgs)-1]
		p.ready[size] = imgs[:len(imgs)-1]
	}
	p.mu.Unlock()
	if img == "" {
		return false
	}
	if err := os.Rename(img, dst); err != nil {
		p.log.Warn("disk_pool_take", "image", img, "err", err)
		os.Remove(img)
		return false
	}
	return true
}

// warm fills the pool for size in the background, unless a fill for that
// size is already running.
func (p *diskPool) warm(size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filling[size] || p.ctx.Err() != nil {
		return
	}
	p.filling[size] = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.fill(size)
	}()
}

func (p *diskPool) fill(size int64) {
	defer func() {
		p.mu.Lock()
		p.filling[size] = false
		p.mu.Unlock()
	}()
	for p.ctx.Err() == nil {
		p.mu.Lock()
		n := len(p.ready[size])
		p.mu.Unlock()
		if n >= p.depth {
			return
		}
		var b [6]byte
		rand.Read(b[:])
		img := filepath.Join(p.dir, fmt.Sprintf("%d-%s.img", size, hex.EncodeToString(b[:])))
		if err := diskimg.Make(p.ctx, img, size, diskimg.Format{Background: true}); err != nil {
			os.Remove(img)
			if p.ctx.Err() == nil {
				p.log.Warn("disk_pool_fill", "size", size, "err", err)
			}
			return
		}
		p.mu.Lock()
		p.ready[size] = append(p.ready[size], img)
		p.mu.Unlock()
	}
}

// close stops filling, waits for fills in flight and removes spare images.
func (p *diskPool) close() {
	p.cancel()
	p.wg.Wait()
	os.RemoveAll(p.dir)
}
