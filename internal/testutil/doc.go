// Package testutil holds the small helpers every test package shares: Golden compares
// output with a file under testdata/ and prints a go-cmp diff when they differ. It
// depends on nothing but the standard library and go-cmp, so any test may import it
// without pulling in the API server machinery of internal/testenv.
package testutil
