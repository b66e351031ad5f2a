package imagecache

import (
	"context"
	"fmt"
	"sync"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// imageJob is the background fetch of one base image into one host's pool: started by the
// first Create that needs the image there and joined by every later one until it ends.
type imageJob struct {
	mu       sync.Mutex
	progress provider.Progress
	// waiters are the instance names of the Creates that started or joined the job; a
	// failure is reported to each of them once.
	waiters map[string]bool
}

func (j *imageJob) setProgress(p provider.Progress) {
	j.mu.Lock()
	j.progress = p
	j.mu.Unlock()
}

func (j *imageJob) pending() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return provider.Pending(j.progress)
}

// jobs is the part of the image cache that runs fetches off the caller: the jobs in
// flight by ImageLockKey, the failures not yet reported to every waiter, and the context
// the jobs run on, which Close cancels.
type jobs struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	running map[string]*imageJob
	// failed holds, by key and then instance name, the error each waiter of a failed job
	// still has to be told.
	failed map[string]map[string]error
}

func newJobs() *jobs {
	ctx, cancel := context.WithCancel(context.Background())
	return &jobs{ctx: ctx, cancel: cancel, running: map[string]*imageJob{}, failed: map[string]map[string]error{}}
}

// failure returns, once, the error of a failed job that name waited on.
func (js *jobs) failure(key, name string) error {
	js.mu.Lock()
	defer js.mu.Unlock()
	err := js.failed[key][name]
	if err != nil {
		delete(js.failed[key], name)
		if len(js.failed[key]) == 0 {
			delete(js.failed, key)
		}
	}
	return err
}

// join adds name to the job running for key and returns its pending result, or nil when
// no job runs.
func (js *jobs) join(key, name string) error {
	js.mu.Lock()
	j := js.running[key]
	if j != nil {
		j.mu.Lock()
		j.waiters[name] = true
		j.mu.Unlock()
	}
	js.mu.Unlock()
	if j == nil {
		return nil
	}
	return j.pending()
}

// start runs fetch for key in the background with name as its first waiter, unless a job
// for key runs already, which name then joins. It returns the pending result. fetch
// reports its progress through provider.ReportProgress on the context it is given.
func (js *jobs) start(key, name string, first provider.Progress, fetch func(ctx context.Context) error) error {
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.closed {
		return provider.Errorf(provider.ErrTransient, "the provider is shutting down")
	}
	if j := js.running[key]; j != nil {
		j.mu.Lock()
		j.waiters[name] = true
		j.mu.Unlock()
		return j.pending()
	}
	j := &imageJob{progress: first, waiters: map[string]bool{name: true}}
	js.running[key] = j
	js.wg.Add(1)
	go func() {
		defer js.wg.Done()
		err := fetch(provider.WithProgress(js.ctx, j.setProgress))
		js.finish(key, j, err)
	}()
	return j.pending()
}

// finish ends job j of key: it is no longer joined, and when it failed every waiter is
// told its error once (a success is found in the pool itself).
func (js *jobs) finish(key string, j *imageJob, err error) {
	js.mu.Lock()
	defer js.mu.Unlock()
	delete(js.running, key)
	if err == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if js.failed[key] == nil {
		js.failed[key] = map[string]error{}
	}
	for name := range j.waiters {
		js.failed[key][name] = err
	}
}

// close cancels every job and waits until they have ended; later starts are refused.
func (js *jobs) close() {
	js.mu.Lock()
	js.closed = true
	js.mu.Unlock()
	js.cancel()
	js.wg.Wait()
}

// Base is the image step of a Create of instance name on host h: the base of img in pool
// when it is cached, else the pending result of the job fetching it (started here when none runs,
// after the pool-space precheck), or once, to each Create that waited on it, the error of
// a job that failed. The download never runs on ctx: it belongs to the provider.
func (c *Cache) Base(ctx context.Context, b Storage, h provider.KVMHost, pool libvirt.StoragePool, img Image, name string) (Base, error) {
	key := ImageLockKey(h, img)
	if err := c.jobs.failure(key, name); err != nil {
		return Base{}, err
	}
	if err := c.jobs.join(key, name); err != nil {
		return Base{}, err
	}
	cache, err := c.checkPoolSpace(ctx, b, h, pool, img)
	if err != nil {
		return Base{}, err
	}
	if cache.complete() && cache.base != nil {
		return basePath(b, h, img, *cache.base)
	}
	first := provider.Progress{Reason: provider.ReasonImageDownloading,
		Message: fmt.Sprintf("fetching base image %s to host %s", img.Key, h.Name)}
	return Base{}, c.jobs.start(key, name, first, func(ctx context.Context) error {
		return c.fetchJob(ctx, h, img)
	})
}

// fetchJob is the body of an image job: on the host's pooled connection and under the
// image's fetch lock, it fetches img unless a complete copy is found there by then
// (another provider's job for the same host may have cached it).
func (c *Cache) fetchJob(ctx context.Context, h provider.KVMHost, img Image) error {
	log := c.log.WithValues("host", h.Name, "volume", img.BaseVol())
	err := func() error {
		b, err := c.hosts.Pooled(ctx, h.Name)
		if err != nil {
			return err
		}
		pool, err := b.StoragePoolLookupByName(h.Pool)
		if err != nil {
			return fmt.Errorf("looking up pool %s on host %s: %w", h.Pool, h.Name, err)
		}
		unlock, err := c.locks.Lock(ctx, ImageLockKey(h, img))
		if err != nil {
			return provider.Transient(fmt.Errorf("waiting for the fetch of base image %s on host %s: %w",
				img.BaseVol(), h.Name, err))
		}
		defer unlock()
		if _, ok, err := c.cachedImage(log, b, h, pool, img); err != nil || ok {
			return err
		}
		_, err = c.Fetch(ctx, log, b, h, pool, img)
		return err
	}()
	if err != nil {
		err = c.failed(log, "image fetch", err)
		log.Info("base image fetch failed", "class", provider.ClassName(err), "error", err.Error())
	}
	return err
}
