package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// recorded is one Proxy the demo's cluster has held. The UID is what tells this demo's
// domains from any other on the shared libvirt host: the kvm2 mark carries the owning
// Proxy's UID, and a UID belongs to one Proxy of one cluster only.
type recorded struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	Instance  string `json:"instance"`
}

// record is the list of every Proxy the demo's cluster has held, kept in a file so that
// down can still find their domains when the API server is gone.
type record struct {
	Proxies []recorded `json:"proxies"`
}

// loadRecord reads the record at path; a missing file is an empty record.
func loadRecord(path string) (*record, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return &record{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the record %s: %w", path, err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("parsing the record %s: %w", path, err)
	}
	return &r, nil
}

// save writes the record to path through a temporary file, so a reader never sees half.
func (r *record) save(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the record %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing the record %s: %w", path, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	_, err = tmp.Write(append(data, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing the record %s: %w", path, err)
	}
	return nil
}

// lockRecord takes an exclusive lock beside the record at path, so the control plane's
// rounds and down's own recording never lose each other's additions; the returned func
// releases it.
func lockRecord(path string) (func(), error) {
	f, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("locking the record %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("locking the record %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}

// add records the Proxies not recorded yet and reports whether any was new.
func (r *record) add(items []v1alpha1.Proxy) bool {
	changed := false
	for i := range items {
		px := &items[i]
		// An External Proxy has no domain of its own to look for, unless it had one
		// as a Managed Proxy before.
		external := px.Spec.Mode == v1alpha1.ProxyModeExternal && px.Status.ProviderID == ""
		if px.UID == "" || external || r.has(string(px.UID)) {
			continue
		}
		r.Proxies = append(r.Proxies, recorded{
			Namespace: px.Namespace, Name: px.Name, UID: string(px.UID), Instance: px.InstanceName(),
		})
		changed = true
	}
	return changed
}

func (r *record) has(uid string) bool {
	return slices.ContainsFunc(r.Proxies, func(p recorded) bool { return p.UID == uid })
}

// recordProxies lists every Proxy (all namespaces) through c and adds them to the record
// at path.
func recordProxies(ctx context.Context, c client.Client, path string) ([]v1alpha1.Proxy, error) {
	// Listed under the lock: a list taken before a sweep released the finalizers must not
	// be saved after it, bringing back a record of Proxies that are gone.
	unlock, err := lockRecord(path)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var list v1alpha1.ProxyList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing the Proxies: %w", err)
	}
	r, err := loadRecord(path)
	if err != nil {
		return nil, err
	}
	if r.add(list.Items) {
		if err := r.save(path); err != nil {
			return nil, err
		}
	}
	return list.Items, nil
}

// keepRecord records the cluster's Proxies every interval until ctx ends. A failed round
// is reported on errOut and retried at the next tick.
func keepRecord(ctx context.Context, c client.Client, path string, interval time.Duration, errOut io.Writer) {
	t := time.NewTicker(interval)
	defer t.Stop()
	last := ""
	for {
		_, err := recordProxies(ctx, c, path)
		if msg := fmt.Sprint(err); err != nil && msg != last {
			fmt.Fprintf(errOut, "recording the Proxies in %s: %v\n", path, err)
			last = msg
		} else if err == nil {
			last = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
