package libvirtfake

import (
	"strings"

	"github.com/digitalocean/go-libvirt"
)

type pool struct {
	name     string
	uuid     libvirt.UUID
	path     string
	active   bool
	capacity uint64
	vols     map[string]*volume
}

type volume struct {
	name       string
	xml        string
	format     string
	capacity   uint64 // the virtual size libvirt reports
	allocation uint64 // bytes taken from the pool
	content    []byte // bytes written by uploads; the rest of the file reads as zeros
	backing    string
	backingFmt string
	inUse      int // running uploads and downloads
}

func (p *pool) allocation() uint64 {
	var n uint64
	for _, v := range p.vols {
		n += v.allocation
	}
	return n
}

func (p *pool) available() uint64 {
	if a := p.allocation(); a < p.capacity {
		return p.capacity - a
	}
	return 0
}

func (p *pool) volPath(name string) string {
	return strings.TrimSuffix(p.path, "/") + "/" + name
}

func (p *pool) handle() libvirt.StoragePool {
	return libvirt.StoragePool{Name: p.name, UUID: p.uuid}
}

func (p *pool) volHandle(v *volume) libvirt.StorageVol {
	return libvirt.StorageVol{Pool: p.name, Name: v.name, Key: p.volPath(v.name)}
}

// poolByHandle finds a pool the way libvirt's storage driver does: by UUID.
// Callers hold f.mu.
func (f *Fake) poolByHandle(h libvirt.StoragePool) (*pool, error) {
	for _, p := range f.pools {
		if p.uuid == h.UUID {
			return p, nil
		}
	}
	return nil, errNoPoolUUID(h)
}

// volByHandle finds a volume by its pool's name and its own name, requiring
// the pool to be running, as libvirt's storage driver does. Callers hold f.mu.
func (f *Fake) volByHandle(h libvirt.StorageVol) (*pool, *volume, error) {
	p, ok := f.pools[h.Pool]
	if !ok {
		return nil, nil, errNoPoolName(h.Pool)
	}
	if !p.active {
		return nil, nil, errPoolInactive(p.name)
	}
	v, ok := p.vols[h.Name]
	if !ok {
		return nil, nil, errNoVolName(h.Name)
	}
	return p, v, nil
}

// StoragePoolLookupByName implements the backend method.
func (f *Fake) StoragePoolLookupByName(name string) (libvirt.StoragePool, error) {
	const m = "StoragePoolLookupByName"
	if err := f.enter(m); err != nil {
		return libvirt.StoragePool{}, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pools[name]
	if !ok {
		return libvirt.StoragePool{}, errNoPoolName(name)
	}
	return p.handle(), nil
}

// StoragePoolGetInfo implements the backend method. An inactive pool answers
// with state StoragePoolInactive and its last known sizes.
func (f *Fake) StoragePoolGetInfo(h libvirt.StoragePool) (uint8, uint64, uint64, uint64, error) {
	const m = "StoragePoolGetInfo"
	if err := f.enter(m); err != nil {
		return 0, 0, 0, 0, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.poolByHandle(h)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	state := uint8(libvirt.StoragePoolInactive)
	if p.active {
		state = uint8(libvirt.StoragePoolRunning)
	}
	return state, p.capacity, p.allocation(), p.available(), nil
}

// StoragePoolRefresh implements the backend method: like a dir pool's
// refresh it probes every volume's content, so a raw volume holding a qcow2
// image is reported as qcow2 with the image's virtual size afterwards.
func (f *Fake) StoragePoolRefresh(h libvirt.StoragePool, flags uint32) error {
	const m = "StoragePoolRefresh"
	if err := f.enter(m); err != nil {
		return err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.poolByHandle(h)
	if err != nil {
		return err
	}
	if !p.active {
		return errPoolInactive(p.name)
	}
	for _, v := range p.vols {
		if v.inUse == 0 {
			v.probe()
		}
	}
	return nil
}

// StorageVolLookupByName implements the backend method.
func (f *Fake) StorageVolLookupByName(h libvirt.StoragePool, name string) (libvirt.StorageVol, error) {
	const m = "StorageVolLookupByName"
	if err := f.enter(m); err != nil {
		return libvirt.StorageVol{}, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.poolByHandle(h)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	if !p.active {
		return libvirt.StorageVol{}, errPoolInactive(p.name)
	}
	v, ok := p.vols[name]
	if !ok {
		return libvirt.StorageVol{}, errNoVolName(name)
	}
	return p.volHandle(v), nil
}

// StorageVolCreateXML implements the backend method; see parseVolumeXML for
// the XML it understands.
func (f *Fake) StorageVolCreateXML(h libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error) {
	const m = "StorageVolCreateXML"
	if err := f.enter(m); err != nil {
		return libvirt.StorageVol{}, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := f.poolByHandle(h)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	if !p.active {
		return libvirt.StorageVol{}, errPoolInactive(p.name)
	}
	v, err := parseVolumeXML(xml)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	if _, ok := p.vols[v.name]; ok {
		return libvirt.StorageVol{}, errVolExists(v.name)
	}
	if v.backing != "" {
		b := f.volByPath(v.backing)
		if b == nil {
			return libvirt.StorageVol{}, systemError("No such file or directory",
				"inaccessible backing store volume %s", v.backing)
		}
		if v.capacity == 0 {
			v.capacity = b.capacity
		}
	}
	if v.allocation > p.available() {
		return libvirt.StorageVol{}, systemError("No space left on device",
			"cannot allocate %d bytes in file '%s'", v.allocation, p.volPath(v.name))
	}
	p.vols[v.name] = v
	return p.volHandle(v), nil
}

// volByPath finds a volume in any pool by its path. Callers hold f.mu.
func (f *Fake) volByPath(path string) *volume {
	for _, p := range f.pools {
		for _, v := range p.vols {
			if p.volPath(v.name) == path {
				return v
			}
		}
	}
	return nil
}

// StorageVolGetPath implements the backend method: the pool's path joined
// with the volume's name.
func (f *Fake) StorageVolGetPath(h libvirt.StorageVol) (string, error) {
	const m = "StorageVolGetPath"
	if err := f.enter(m); err != nil {
		return "", err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	p, v, err := f.volByHandle(h)
	if err != nil {
		return "", err
	}
	return p.volPath(v.name), nil
}

// StorageVolGetInfo implements the backend method; the type is always
// StorageVolFile, as in a dir pool.
func (f *Fake) StorageVolGetInfo(h libvirt.StorageVol) (int8, uint64, uint64, error) {
	const m = "StorageVolGetInfo"
	if err := f.enter(m); err != nil {
		return 0, 0, 0, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	_, v, err := f.volByHandle(h)
	if err != nil {
		return 0, 0, 0, err
	}
	return int8(libvirt.StorageVolFile), v.capacity, v.allocation, nil
}

// StorageVolDelete implements the backend method. A volume with an upload or
// download in progress is refused, as libvirt refuses a volume in use.
func (f *Fake) StorageVolDelete(h libvirt.StorageVol, flags libvirt.StorageVolDeleteFlags) error {
	const m = "StorageVolDelete"
	if err := f.enter(m); err != nil {
		return err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	p, v, err := f.volByHandle(h)
	if err != nil {
		return err
	}
	if v.inUse > 0 {
		return errVolInUse(v.name)
	}
	delete(p.vols, v.name)
	return nil
}
