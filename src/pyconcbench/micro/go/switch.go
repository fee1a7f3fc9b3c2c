// Go baselines of the context-switch microbenchmarks (pyconcbench.micro.golang builds and
// runs this file).
//
//	switch CASE N [GOROUTINES]
//
// times N iterations of CASE inside Go (after an untimed warm-up of N/10) and the same number
// of iterations of an empty loop, and prints one JSON object:
//
//	{"case": ..., "n": N, "goroutines": G, "ops": ..., "elapsed_ns": ..., "empty_ns": ...,
//	 "check": ..., "gomaxprocs": ..., "go": "go1.x"}
//
// Cases (one op, and what check counts):
//
//	goroutine      create a goroutine and let it finish (batches of 1000, then wait); check:
//	               goroutines that ran
//	chan_pingpong  one hand-off over an unbuffered channel between two goroutines; N round
//	               trips = 2N ops; check: round trips answered
//	mutex_handoff  one hand-off of a sync.Mutex pair between two goroutines (each unlocks
//	               the mutex the other waits on); 2N ops; check: round trips answered
//	gosched        one runtime.Gosched() by any of GOROUTINES goroutines (N shared among
//	               them); check: calls made
//
// Exit status 2 and a message on stderr for bad arguments.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

var sink uint64

type result struct {
	Case       string `json:"case"`
	N          int    `json:"n"`
	Goroutines int    `json:"goroutines"`
	Ops        int    `json:"ops"`
	ElapsedNs  int64  `json:"elapsed_ns"`
	EmptyNs    int64  `json:"empty_ns"`
	Check      int64  `json:"check"`
	Gomaxprocs int    `json:"gomaxprocs"`
	Go         string `json:"go"`
}

//go:noinline
func emptyLoop(n int) time.Duration {
	t0 := time.Now()
	for i := 0; i < n; i++ {
		sink++
	}
	return time.Since(t0)
}

const batch = 1000

func goroutines(n int) (time.Duration, int, int64) {
	var wg sync.WaitGroup
	var ran int64
	t0 := time.Now()
	for done := 0; done < n; {
		m := batch
		if n-done < m {
			m = n - done
		}
		wg.Add(m)
		for j := 0; j < m; j++ {
			go func() {
				atomic.AddInt64(&ran, 1)
				wg.Done()
			}()
		}
		wg.Wait()
		done += m
	}
	return time.Since(t0), n, atomic.LoadInt64(&ran)
}

func chanPingPong(n int) (time.Duration, int, int64) {
	ping, pong := make(chan int), make(chan int)
	var answered int64
	go func() {
		for v := range ping {
			answered++
			pong <- v
		}
		close(pong)
	}()
	t0 := time.Now()
	for i := 0; i < n; i++ {
		ping <- i
		if <-pong != i {
			panic("chan_pingpong: wrong value")
		}
	}
	elapsed := time.Since(t0)
	close(ping)
	<-pong // closed once the peer has stopped: answered is final
	return elapsed, 2 * n, answered
}

func mutexHandoff(n int) (time.Duration, int, int64) {
	// Both start locked.  The main goroutine unlocks a (the peer's turn) and waits on b; the
	// peer takes a, unlocks b (main's turn).  A Go mutex may be unlocked by any goroutine.
	var a, b sync.Mutex
	a.Lock()
	b.Lock()
	var answered int64
	finished := make(chan struct{})
	go func() {
		for i := 0; i < n; i++ {
			a.Lock()
			answered++
			b.Unlock()
		}
		close(finished)
	}()
	t0 := time.Now()
	for i := 0; i < n; i++ {
		a.Unlock()
		b.Lock()
	}
	elapsed := time.Since(t0)
	<-finished
	return elapsed, 2 * n, answered
}

func gosched(n, g int) (time.Duration, int, int64) {
	k := n / g
	if k < 1 {
		k = 1
	}
	var ready, wg sync.WaitGroup
	var calls int64
	start := make(chan struct{})
	ready.Add(g)
	wg.Add(g)
	for j := 0; j < g; j++ {
		go func() {
			defer wg.Done()
			ready.Done()
			<-start
			for i := 0; i < k; i++ {
				runtime.Gosched()
			}
			atomic.AddInt64(&calls, int64(k))
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	wg.Wait()
	return time.Since(t0), g * k, atomic.LoadInt64(&calls)
}

func usage(msg string) {
	fmt.Fprintln(os.Stderr, "switch: "+msg)
	fmt.Fprintln(os.Stderr, "usage: switch goroutine|chan_pingpong|mutex_handoff|gosched N [GOROUTINES]")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 3 || len(os.Args) > 4 {
		usage("wrong number of arguments")
	}
	name := os.Args[1]
	n, err := strconv.Atoi(os.Args[2])
	if err != nil || n < 1 {
		usage("N must be a whole number >= 1, got " + strconv.Quote(os.Args[2]))
	}
	g := 1
	if len(os.Args) == 4 {
		g, err = strconv.Atoi(os.Args[3])
		if err != nil || g < 1 || g > 1<<20 {
			usage("GOROUTINES must be 1 .. 1048576, got " + strconv.Quote(os.Args[3]))
		}
	}
	var run func(int) (time.Duration, int, int64)
	switch name {
	case "goroutine":
		run = goroutines
	case "chan_pingpong":
		run = chanPingPong
	case "mutex_handoff":
		run = mutexHandoff
	case "gosched":
		run = func(m int) (time.Duration, int, int64) { return gosched(m, g) }
	default:
		usage("unknown case " + strconv.Quote(name))
	}
	warm := n / 10
	if warm < 1 {
		warm = 1
	}
	run(warm)
	runtime.GC()
	empty := emptyLoop(n)
	elapsed, ops, check := run(n)
	out, _ := json.Marshal(result{
		Case: name, N: n, Goroutines: g, Ops: ops, ElapsedNs: elapsed.Nanoseconds(),
		EmptyNs: empty.Nanoseconds(), Check: check, Gomaxprocs: runtime.GOMAXPROCS(0),
		Go: runtime.Version(),
	})
	fmt.Println(string(out))
}
