// connload: a new connection for every request, opened at a fixed rate (open loop), timed from
// the moment each connection was due to the end of its answer.
//
// wrk times a request from its write to its answer; with a new connection per request the
// connect and the TLS handshake fall outside that span. When the load generator's core is the
// bottleneck (a closed loop of wrk's TLS clients saturates it here), a proxy that completes
// handshakes sooner moves the wait into the span wrk measures. This tool times what a client
// of such a proxy waits for: connect, handshake (TLS 1.3, X25519, resumed from a ticket after
// the first), request and answer, each connection started on schedule whether or not earlier
// ones have finished (so a stall shows in every connection due during it, as wrk2 does).
//
// Output: one line of key=value pairs (latencies in microseconds) for bench/run.sh.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"
)

type options struct {
	addr     string
	host     string
	useTLS   bool
	caFile   string
	workers  int
	rate     float64
	duration time.Duration
	timeout  time.Duration
}

// sample is one connection's outcome: whole is from when it was due to its answer's end,
// request from the end of its handshake (or its connect, over plain TCP) to the same end.
type sample struct {
	whole, request time.Duration
	resumed        bool
}

type tally struct {
	whole, request []time.Duration
	resumed, bad   int
}

func main() {
	var o options
	flag.StringVar(&o.addr, "a", "127.0.0.1:18086", "address to connect to")
	flag.StringVar(&o.host, "host", "localhost", "Host field and TLS server name")
	flag.BoolVar(&o.useTLS, "tls", false, "speak TLS 1.3 (HTTP/1.1 over it)")
	flag.StringVar(&o.caFile, "ca", "", "PEM certificate to verify the server with (TLS)")
	flag.IntVar(&o.workers, "c", 32, "connections open at most at once")
	flag.Float64Var(&o.rate, "r", 1000, "new connections a second, in all")
	flag.DurationVar(&o.duration, "d", 5*time.Second, "how long to offer load")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Second, "deadline for each connection")
	flag.Parse()
	if o.workers < 1 || o.rate <= 0 || o.duration <= 0 {
		fail("-c, -r and -d must be positive")
	}
	cfg, err := tlsConfig(o)
	if err != nil {
		fail(err.Error())
	}
	total := run(o, cfg)
	report(total, o)
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "connload:", msg)
	os.Exit(2)
}

func tlsConfig(o options) (*tls.Config, error) {
	if !o.useTLS {
		return nil, nil
	}
	cfg := &tls.Config{
		ServerName:         o.host,
		MinVersion:         tls.VersionTLS13,
		CurvePreferences:   []tls.CurveID{tls.X25519},
		NextProtos:         []string{"http/1.1"},
		ClientSessionCache: tls.NewLRUClientSessionCache(1024),
	}
	if o.caFile == "" {
		cfg.InsecureSkipVerify = true
		return cfg, nil
	}
	pem, err := os.ReadFile(o.caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", o.caFile)
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// run gives each worker every workers-th slot of the schedule, staggered, so that the whole
// offers o.rate connections a second.
func run(o options, cfg *tls.Config) tally {
	var mu sync.Mutex
	var total tally
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(o.duration)
	gap := time.Duration(float64(o.workers) / o.rate * float64(time.Second))
	for w := 0; w < o.workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var mine tally
			for due := start.Add(gap * time.Duration(w) / time.Duration(o.workers)); due.Before(end); due = due.Add(gap) {
				time.Sleep(time.Until(due))
				s, err := exchange(o, cfg, due)
				if err != nil {
					mine.bad++
					continue
				}
				mine.whole = append(mine.whole, s.whole)
				mine.request = append(mine.request, s.request)
				if s.resumed {
					mine.resumed++
				}
			}
			mu.Lock()
			total.whole = append(total.whole, mine.whole...)
			total.request = append(total.request, mine.request...)
			total.resumed += mine.resumed
			total.bad += mine.bad
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	return total
}

// exchange opens one connection, sends one GET with `Connection: close` and reads the answer
// to its end; anything but a 200 counts as a failure.
func exchange(o options, cfg *tls.Config, due time.Time) (sample, error) {
	var s sample
	tcp, err := net.DialTimeout("tcp", o.addr, o.timeout)
	if err != nil {
		return s, err
	}
	defer tcp.Close()
	if err := tcp.SetDeadline(due.Add(o.timeout)); err != nil {
		return s, err
	}
	conn := net.Conn(tcp)
	if cfg != nil {
		tlsConn := tls.Client(tcp, cfg)
		if err := tlsConn.Handshake(); err != nil {
			return s, err
		}
		s.resumed = tlsConn.ConnectionState().DidResume
		conn = tlsConn
	}
	sent := time.Now()
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: "+o.host+"\r\nConnection: close\r\n\r\n"); err != nil {
		return s, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return s, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return s, err
	}
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("status %d", resp.StatusCode)
	}
	done := time.Now()
	s.whole, s.request = done.Sub(due), done.Sub(sent)
	return s, nil
}

func percentile(v []time.Duration, p float64) int64 {
	if len(v) == 0 {
		return -1
	}
	return v[int(p*float64(len(v)-1)+0.5)].Microseconds()
}

func report(t tally, o options) {
	sort.Slice(t.whole, func(i, j int) bool { return t.whole[i] < t.whole[j] })
	sort.Slice(t.request, func(i, j int) bool { return t.request[i] < t.request[j] })
	fmt.Printf("ok=%d bad=%d resumed=%d rate=%.0f whole_p50=%d whole_p99=%d whole_p999=%d request_p50=%d request_p99=%d\n",
		len(t.whole), t.bad, t.resumed, float64(len(t.whole))/o.duration.Seconds(),
		percentile(t.whole, 0.5), percentile(t.whole, 0.99), percentile(t.whole, 0.999),
		percentile(t.request, 0.5), percentile(t.request, 0.99))
}
