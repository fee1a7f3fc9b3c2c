// Echo server for pyconcbench (implementation go_net): serves an inherited listening socket,
// TCP or UNIX, with one goroutine per connection running a Read/Write loop over a 64 KiB
// buffer, as in uvloop's echo study.  Go sets TCP_NODELAY on TCP connections by default; the
// launcher sets GOMAXPROCS=1.
//
//	echo [FD]    serve the listening socket on descriptor FD (default 3)
//
// It prints READY on stdout once it serves, its stop handlers in place.  On SIGTERM, SIGINT or
// SIGHUP it stops accepting, closes every connection, prints
// {"accepted": N, "bytes": N, "errors": N} on stdout and exits 0.  Bytes are counted when
// read, before they are written back.  Standard library only, and few packages of it (no fmt,
// no encoding/json), so that a first build with a cold Go cache stays short.
package main

import (
	"errors"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	bufSize     = 64 << 10
	acceptPause = 10 * time.Millisecond // after EMFILE and the like
	drainWait   = 200 * time.Millisecond
)

type server struct {
	ln       net.Listener
	accepted int64 // atomic
	bytes    int64 // atomic
	errors   int64 // atomic

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closing bool
	wg      sync.WaitGroup
}

// quiet reports errors that end a connection normally: EOF, a reset or broken pipe from the
// client, or our own close at shutdown.
func quiet(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (s *server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *server) forget(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

func (s *server) echo(c net.Conn) {
	defer s.wg.Done()
	defer s.forget(c)
	buf := make([]byte, bufSize)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			atomic.AddInt64(&s.bytes, int64(n))
			if _, werr := c.Write(buf[:n]); werr != nil {
				if !quiet(werr) {
					atomic.AddInt64(&s.errors, 1)
				}
				return
			}
		}
		if err != nil {
			if !quiet(err) {
				atomic.AddInt64(&s.errors, 1)
			}
			return
		}
	}
}

func (s *server) acceptLoop() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			atomic.AddInt64(&s.errors, 1) // out of descriptors or memory: pause, then retry
			time.Sleep(acceptPause)
			continue
		}
		atomic.AddInt64(&s.accepted, 1)
		if !s.track(c) {
			c.Close()
			continue
		}
		s.wg.Add(1)
		go s.echo(c)
	}
}

// stop closes the listener and every connection, then waits (bounded) for the connection
// goroutines, so the counts it returns are final.
func (s *server) stop() {
	s.ln.Close()
	s.mu.Lock()
	s.closing = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(drainWait):
	}
}

func main() {
	fd := 3
	if len(os.Args) > 1 {
		n, err := strconv.Atoi(os.Args[1])
		if err != nil || n < 0 {
			os.Stderr.WriteString("echo: not a file descriptor: " + strconv.Quote(os.Args[1]) + "\n")
			os.Exit(2)
		}
		fd = n
	}
	f := os.NewFile(uintptr(fd), "listener")
	ln, err := net.FileListener(f) // dups the descriptor; works for TCP and UNIX listeners
	if err != nil {
		os.Stderr.WriteString("echo: fd " + strconv.Itoa(fd) + " is not a listening socket: " +
			err.Error() + "\n")
		os.Exit(2)
	}
	f.Close()

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	s := &server{ln: ln, conns: make(map[net.Conn]struct{})}
	go s.acceptLoop()
	os.Stdout.WriteString("READY\n")
	<-signals
	s.stop()

	report := `{"accepted": ` + strconv.FormatInt(atomic.LoadInt64(&s.accepted), 10) +
		`, "bytes": ` + strconv.FormatInt(atomic.LoadInt64(&s.bytes), 10) +
		`, "errors": ` + strconv.FormatInt(atomic.LoadInt64(&s.errors), 10) + "}\n"
	os.Stdout.WriteString(report) // a launcher gone already is not an error here
	os.Exit(0)
}
