package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// shutdownTimeout bounds how long a scrape in progress may hold up the
// agent's exit.
const shutdownTimeout = 5 * time.Second

// Handler serves /metrics (exp's registry), /healthz (200 while serving)
// and /readyz (200 when ready returns nil, 503 with its error otherwise;
// nil ready is always ready).
func Handler(exp *Exporter, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(exp.reg, promhttp.HandlerOpts{
		// A metric that cannot be gathered is logged and left out; the
		// rest is still served (a failed source is already skipped and
		// counted by Collect).
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      slogPrintln{},
		Registry:      exp.reg, // promhttp_metric_handler_errors_total
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Serve listens on addr (DefaultAddr when empty) and serves Handler until
// ctx ends, then shuts down (scrapes in progress get shutdownTimeout to
// finish). It returns nil after a clean shutdown.
func Serve(ctx context.Context, addr string, exp *Exporter, ready func() error) error {
	if addr == "" {
		addr = DefaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	return ServeListener(ctx, ln, exp, ready)
}

// ServeListener is Serve on a listener the caller opened (to learn the
// port of ":0", or a socket systemd passed); it closes ln.
func ServeListener(ctx context.Context, ln net.Listener, exp *Exporter, ready func() error) error {
	srv := &http.Server{
		Handler:           Handler(exp, ready),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("metrics: shut down %s: %w", ln.Addr(), err)
	}
	return nil
}

// slogPrintln is promhttp's error log on slog.
type slogPrintln struct{}

func (slogPrintln) Println(v ...any) { slog.Warn("metrics: " + fmt.Sprint(v...)) }
