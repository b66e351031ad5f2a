package main

import (
	"os"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
)

// TestMain runs up to 4 of the tests that run the manager binary at once: each has its
// own API server and process and spends most of its time waiting for them, so on two
// cores four at once take about half the wall time of one after another. The tests that
// set environment variables, measure memory or time a drain stay serial (they run first).
// -parallel on the command line wins.
func TestMain(m *testing.M) {
	controllertest.Parallel(4)
	os.Exit(m.Run())
}
