package gateway

import (
	"context"
	"errors"
	"net"
	"testing"
)

func TestNewNeedsChooserAndAuthenticator(t *testing.T) {
	if _, err := New(Config{Chooser: &testChooser{}}); !errors.Is(err, ErrMissingCollaborator) {
		t.Errorf("New without an Authenticator: %v", err)
	}
	if _, err := New(Config{Authenticator: testAuth{}}); !errors.Is(err, ErrMissingCollaborator) {
		t.Errorf("New without a Chooser: %v", err)
	}
}

// After Shutdown, Serve takes no listener and says why.
func TestServeAfterShutdown(t *testing.T) {
	g, err := New(Config{Chooser: &testChooser{}, Authenticator: testAuth{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Serve(ln); !errors.Is(err, ErrShuttingDown) {
		t.Errorf("Serve after Shutdown = %v, want ErrShuttingDown", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Errorf("the listener given after Shutdown still accepts")
	}
}
