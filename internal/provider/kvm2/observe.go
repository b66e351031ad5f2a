package kvm2

import (
	"context"
	"io"
	"maps"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// rpcTracer opens the kvm2.<Method> and kvm2.dial spans.
var rpcTracer = otel.Tracer("gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2")

// rpcCounter counts libvirt RPCs by method, for the RPCs-per-operation figures of tests and
// benchmarks.
type rpcCounter struct {
	mu       sync.Mutex
	byMethod map[string]int64
}

func newRPCCounter() *rpcCounter { return &rpcCounter{byMethod: map[string]int64{}} }

func (r *rpcCounter) add(method string) {
	r.mu.Lock()
	r.byMethod[method]++
	r.mu.Unlock()
}

// total is the number of RPCs made since the last reset.
func (r *rpcCounter) total() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, v := range r.byMethod {
		n += v
	}
	return n
}

// methods is a copy of the per-method counts.
func (r *rpcCounter) methods() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.byMethod)
}

func (r *rpcCounter) reset() {
	r.mu.Lock()
	clear(r.byMethod)
	r.mu.Unlock()
}

// ids are the identifiers an RPC was given.
type ids struct{ domain, pool, volume string }

func domainIDs(d libvirt.Domain) ids                    { return ids{domain: d.Name} }
func poolIDs(p libvirt.StoragePool) ids                 { return ids{pool: p.Name} }
func volIDs(v libvirt.StorageVol) ids                   { return ids{pool: v.Pool, volume: v.Name} }
func poolVolIDs(p libvirt.StoragePool, name string) ids { return ids{pool: p.Name, volume: name} }

// observed decorates a backend: one client span per RPC, the "libvirt call" line written
// inside it, and the RPC count.
type observed struct {
	ctx   context.Context
	host  string
	log   logr.Logger
	rpcs  *rpcCounter
	inner backend
}

var _ backend = (*observed)(nil)

// do runs one RPC. fn returns the details logged only at V(2) (XML, metadata, addresses,
// listings, sizes, paths); never a body, a key or cloud-init.
func (o *observed) do(method string, id ids, fn func() ([]any, error)) {
	o.rpcs.add(method)
	attrs := []attribute.KeyValue{attribute.String("kvm2.host", o.host)}
	kv := []any{"host", o.host, "rpc", method}
	for _, f := range []struct{ key, attr, v string }{
		{"domain", "kvm2.domain", id.domain}, {"pool", "kvm2.pool", id.pool}, {"volume", "kvm2.volume", id.volume},
	} {
		if f.v != "" {
			attrs = append(attrs, attribute.String(f.attr, f.v))
			kv = append(kv, f.key, f.v)
		}
	}
	ctx, span := rpcTracer.Start(o.ctx, "kvm2."+method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	defer span.End()
	start := time.Now()
	extras, err := fn()
	kv = append(kv, "duration", time.Since(start))
	if err != nil {
		kv = append(kv, "error", err.Error())
		if code, ok := libvirtCode(err); ok {
			kv = append(kv, "libvirtCode", int(code), "libvirtError", code.String())
			span.SetAttributes(attribute.Int("kvm2.libvirt_code", int(code)))
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	log := tracing.Logger(ctx, o.log)
	if v2 := log.V(2); v2.Enabled() && len(extras) > 0 {
		v2.Info("libvirt call", append(kv, extras...)...)
		return
	}
	log.V(1).Info("libvirt call", kv...)
}

func (o *observed) ConnectGetLibVersion() (v uint64, err error) {
	o.do("ConnectGetLibVersion", ids{}, func() ([]any, error) {
		v, err = o.inner.ConnectGetLibVersion()
		return []any{"libVersion", v}, err
	})
	return v, err
}

func (o *observed) ConnectGetHostname() (name string, err error) {
	o.do("ConnectGetHostname", ids{}, func() ([]any, error) {
		name, err = o.inner.ConnectGetHostname()
		return []any{"hostname", name}, err
	})
	return name, err
}

func (o *observed) ConnectListAllDomains(need int32, flags libvirt.ConnectListAllDomainsFlags) (doms []libvirt.Domain, n uint32, err error) {
	o.do("ConnectListAllDomains", ids{}, func() ([]any, error) {
		doms, n, err = o.inner.ConnectListAllDomains(need, flags)
		names := make([]string, len(doms))
		for i, d := range doms {
			names[i] = d.Name
		}
		return []any{"domains", names}, err
	})
	return doms, n, err
}

func (o *observed) StoragePoolLookupByName(name string) (p libvirt.StoragePool, err error) {
	o.do("StoragePoolLookupByName", ids{pool: name}, func() ([]any, error) {
		p, err = o.inner.StoragePoolLookupByName(name)
		return nil, err
	})
	return p, err
}

func (o *observed) StoragePoolGetInfo(pool libvirt.StoragePool) (state uint8, capacity, allocation, available uint64, err error) {
	o.do("StoragePoolGetInfo", poolIDs(pool), func() ([]any, error) {
		state, capacity, allocation, available, err = o.inner.StoragePoolGetInfo(pool)
		return []any{"poolState", poolStateName(state), "capacity", capacity, "allocation", allocation, "available", available}, err
	})
	return state, capacity, allocation, available, err
}

func (o *observed) StoragePoolRefresh(pool libvirt.StoragePool, flags uint32) (err error) {
	o.do("StoragePoolRefresh", poolIDs(pool), func() ([]any, error) {
		err = o.inner.StoragePoolRefresh(pool, flags)
		return nil, err
	})
	return err
}

func (o *observed) StorageVolLookupByName(pool libvirt.StoragePool, name string) (v libvirt.StorageVol, err error) {
	o.do("StorageVolLookupByName", poolVolIDs(pool, name), func() ([]any, error) {
		v, err = o.inner.StorageVolLookupByName(pool, name)
		return nil, err
	})
	return v, err
}

func (o *observed) StorageVolCreateXML(pool libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (v libvirt.StorageVol, err error) {
	o.do("StorageVolCreateXML", ids{pool: pool.Name}, func() ([]any, error) {
		v, err = o.inner.StorageVolCreateXML(pool, xml, flags)
		return []any{"volume", v.Name, "xml", xml}, err
	})
	return v, err
}

func (o *observed) StorageVolGetPath(vol libvirt.StorageVol) (path string, err error) {
	o.do("StorageVolGetPath", volIDs(vol), func() ([]any, error) {
		path, err = o.inner.StorageVolGetPath(vol)
		return []any{"path", path}, err
	})
	return path, err
}

func (o *observed) StorageVolGetInfo(vol libvirt.StorageVol) (typ int8, capacity, allocation uint64, err error) {
	o.do("StorageVolGetInfo", volIDs(vol), func() ([]any, error) {
		typ, capacity, allocation, err = o.inner.StorageVolGetInfo(vol)
		return []any{"type", typ, "capacity", capacity, "allocation", allocation}, err
	})
	return typ, capacity, allocation, err
}

func (o *observed) StorageVolDelete(vol libvirt.StorageVol, flags libvirt.StorageVolDeleteFlags) (err error) {
	o.do("StorageVolDelete", volIDs(vol), func() ([]any, error) {
		err = o.inner.StorageVolDelete(vol, flags)
		return nil, err
	})
	return err
}

func (o *observed) StorageVolUpload(vol libvirt.StorageVol, r io.Reader, offset, length uint64, flags libvirt.StorageVolUploadFlags) (err error) {
	o.do("StorageVolUpload", volIDs(vol), func() ([]any, error) {
		err = o.inner.StorageVolUpload(vol, r, offset, length, flags)
		return []any{"offset", offset, "length", length}, err
	})
	return err
}

func (o *observed) StorageVolDownload(vol libvirt.StorageVol, w io.Writer, offset, length uint64, flags libvirt.StorageVolDownloadFlags) (err error) {
	o.do("StorageVolDownload", volIDs(vol), func() ([]any, error) {
		err = o.inner.StorageVolDownload(vol, w, offset, length, flags)
		return []any{"offset", offset, "length", length}, err
	})
	return err
}

func (o *observed) DomainLookupByName(name string) (d libvirt.Domain, err error) {
	o.do("DomainLookupByName", ids{domain: name}, func() ([]any, error) {
		d, err = o.inner.DomainLookupByName(name)
		return nil, err
	})
	return d, err
}

func (o *observed) DomainDefineXMLFlags(xml string, flags libvirt.DomainDefineFlags) (d libvirt.Domain, err error) {
	o.do("DomainDefineXMLFlags", ids{}, func() ([]any, error) {
		d, err = o.inner.DomainDefineXMLFlags(xml, flags)
		return []any{"defined", d.Name, "xml", xml}, err
	})
	return d, err
}

func (o *observed) DomainCreate(dom libvirt.Domain) (err error) {
	o.do("DomainCreate", domainIDs(dom), func() ([]any, error) {
		err = o.inner.DomainCreate(dom)
		return nil, err
	})
	return err
}

func (o *observed) DomainGetState(dom libvirt.Domain, flags uint32) (state, reason int32, err error) {
	o.do("DomainGetState", domainIDs(dom), func() ([]any, error) {
		state, reason, err = o.inner.DomainGetState(dom, flags)
		return []any{"state", libvirt.DomainState(state).String(), "reason", reason}, err
	})
	return state, reason, err
}

func (o *observed) DomainGetMetadata(dom libvirt.Domain, typ int32, uri libvirt.OptString, flags libvirt.DomainModificationImpact) (md string, err error) {
	o.do("DomainGetMetadata", domainIDs(dom), func() ([]any, error) {
		md, err = o.inner.DomainGetMetadata(dom, typ, uri, flags)
		return []any{"metadata", md}, err
	})
	return md, err
}

func (o *observed) DomainInterfaceAddresses(dom libvirt.Domain, source, flags uint32) (ifaces []libvirt.DomainInterface, err error) {
	o.do("DomainInterfaceAddresses", domainIDs(dom), func() ([]any, error) {
		ifaces, err = o.inner.DomainInterfaceAddresses(dom, source, flags)
		var addrs []string
		for _, i := range ifaces {
			for _, a := range i.Addrs {
				addrs = append(addrs, a.Addr)
			}
		}
		return []any{"source", source, "addresses", addrs}, err
	})
	return ifaces, err
}

func (o *observed) DomainDestroyFlags(dom libvirt.Domain, flags libvirt.DomainDestroyFlagsValues) (err error) {
	o.do("DomainDestroyFlags", domainIDs(dom), func() ([]any, error) {
		err = o.inner.DomainDestroyFlags(dom, flags)
		return nil, err
	})
	return err
}

func (o *observed) DomainReset(dom libvirt.Domain, flags uint32) (err error) {
	o.do("DomainReset", domainIDs(dom), func() ([]any, error) {
		err = o.inner.DomainReset(dom, flags)
		return nil, err
	})
	return err
}

func (o *observed) DomainUndefineFlags(dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) (err error) {
	o.do("DomainUndefineFlags", domainIDs(dom), func() ([]any, error) {
		err = o.inner.DomainUndefineFlags(dom, flags)
		return nil, err
	})
	return err
}

// poolStateName is virsh's word for a pool state.
func poolStateName(state uint8) string {
	switch libvirt.StoragePoolState(state) {
	case libvirt.StoragePoolInactive:
		return "inactive"
	case libvirt.StoragePoolBuilding:
		return "building"
	case libvirt.StoragePoolRunning:
		return "running"
	case libvirt.StoragePoolDegraded:
		return "degraded"
	case libvirt.StoragePoolInaccessible:
		return "inaccessible"
	}
	return "unknown"
}
