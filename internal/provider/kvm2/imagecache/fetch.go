package imagecache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// Fetch downloads img into a new base volume in pool on host h and writes its marker
// last. The bytes stream from the URL into StorageVolUpload on a connection of their own,
// hashed on the way; nothing is held in memory beyond one transfer buffer. The whole fetch
// runs within the transfer budget, under a kvm2.download span. b is the pooled backend:
// it creates the volume, refreshes the pool and writes the marker.
func (c *Cache) Fetch(ctx context.Context, log logr.Logger, b Storage, h provider.KVMHost, pool libvirt.StoragePool, img Image) (vol libvirt.StorageVol, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.hosts.Transfer())
	defer cancel()
	src := urlForUsers(img.URL)
	ctx, span := c.tracer.Start(ctx, "kvm2.download", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("kvm2.host", h.Name), attribute.String("kvm2.volume", img.BaseVol()),
			attribute.String("kvm2.url_host", urlHost(img.URL)), attribute.Bool("kvm2.sha256_configured", img.SHA256 != "")))
	defer func() {
		if err != nil {
			// The error names the URL for the user; the span keeps to its host.
			msg := withoutURL(err.Error(), img.URL)
			span.RecordError(errors.New(msg))
			span.SetStatus(codes.Error, msg)
		}
		span.End()
	}()
	start := time.Now()
	dlCtx, dlCancel := context.WithTimeout(ctx, c.downloadBudget())
	defer dlCancel()
	resp, err := c.GetImage(dlCtx, http.MethodGet, img)
	if err != nil {
		return vol, err
	}
	defer resp.Body.Close()
	length := resp.ContentLength
	span.SetAttributes(attribute.Int64("kvm2.bytes", length))
	log.V(1).Info("fetching base image into host pool", "url", src, "size", length)

	xml, err := c.volumeXML(img.BaseVol(), uint64(length))
	if err != nil {
		return vol, provider.Permanent(err)
	}
	if vol, err = b.StorageVolCreateXML(pool, xml, 0); err != nil {
		return vol, fmt.Errorf("creating base image %s in pool %s on host %s: %w", img.BaseVol(), h.Pool, h.Name, err)
	}
	digest, err := c.UploadImage(ctx, log, h, img, vol, resp.Body, length)
	if err == nil && img.SHA256 != "" && digest != img.SHA256 {
		err = provider.Errorf(provider.ErrPermanent, "image %s has sha256 %s, not the configured %s", src, digest, img.SHA256)
	}
	if err != nil {
		// Without a marker the base is never used; removing it now gives the space back
		// at once. When that fails the next attempt removes it.
		if derr := b.StorageVolDelete(vol, 0); derr != nil {
			log.V(1).Info("could not remove an incomplete base image", "error", derr.Error())
		}
		return vol, err
	}
	if err := c.writeMarker(b, h, pool, img, digest); err != nil {
		return vol, err
	}
	log.V(1).Info("base image cached", "size", length, "duration", time.Since(start), "digest", digest)
	return vol, nil
}

// GetImage sends one request for img's URL and returns the response when its status and
// length make an image of it. The request asks for the body as it is: a transparently
// compressed body would hide its length. A URL from the Proxy goes through the image URL
// policy (urlpolicy.go): its refusals are permanent and named as they are.
func (c *Cache) GetImage(ctx context.Context, method string, img Image) (*http.Response, error) {
	src := urlForUsers(img.URL)
	ctx = withPolicy(ctx, c.policyFor(img))
	req, err := http.NewRequestWithContext(ctx, method, img.URL, nil)
	if err != nil {
		return nil, provider.Permanent(fmt.Errorf("image URL %s: %w", src, err))
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := c.client.Do(req)
	if err != nil {
		// net/http's error repeats the URL; the message names it once.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		if IsPolicyError(err) {
			return nil, err
		}
		return nil, provider.Transient(fmt.Errorf("fetching image %s: %w", src, err))
	}
	if err := checkImageResponse(resp, src); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// checkImageResponse sorts an answer from an image URL: any 4xx but 429 is permanent, 429,
// 5xx and anything else that is not 2xx transient. A 2xx needs a Content-Length, which
// becomes the capacity of the volume, and a body that is not encoded.
func checkImageResponse(resp *http.Response, src string) error {
	switch c := resp.StatusCode; {
	case c == http.StatusTooManyRequests || c >= 500:
		return provider.Errorf(provider.ErrTransient, "image URL %s answered %s", src, resp.Status)
	case c >= 400:
		return provider.Errorf(provider.ErrPermanent, "image URL %s answered %s", src, resp.Status)
	case c < 200 || c > 299:
		return provider.Errorf(provider.ErrTransient, "image URL %s answered %s", src, resp.Status)
	}
	if resp.ContentLength < 0 {
		return provider.Errorf(provider.ErrPermanent,
			"image URL %s sent no Content-Length; the operator needs the size before it uploads", src)
	}
	if resp.ContentLength == 0 {
		return provider.Errorf(provider.ErrPermanent, "image URL %s sent a Content-Length of 0", src)
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return provider.Errorf(provider.ErrPermanent,
			"image URL %s sent a %s-encoded body although the request asked for identity", src, enc)
	}
	return nil
}

// UploadImage streams body, length bytes, into vol on a connection dialled for the
// transfer and closed after it, and returns the sha256 of what was read. A body that fails
// or ends early is reported here, not through the stream: see SourceReader.
func (c *Cache) UploadImage(ctx context.Context, log logr.Logger, h provider.KVMHost, img Image, vol libvirt.StorageVol, body io.Reader, length int64) (string, error) {
	fb, closeFn, err := c.hosts.DialFresh(ctx, h.Name)
	if err != nil {
		return "", err
	}
	defer closeFn()
	src := NewSourceReader(body)
	stop := c.reportProgress(ctx, log, h, img, src, length)
	uerr := fb.StorageVolUpload(vol, src, 0, uint64(length), 0)
	stop()
	n, digest, rerr := src.Finish()
	switch {
	case rerr != nil:
		// The source's error explains a failed upload better than the stream's.
		return "", provider.Transient(fmt.Errorf("downloading image %s to host %s: the body ended after %d of %d bytes: %w",
			urlForUsers(img.URL), h.Name, n, length, rerr))
	case uerr != nil:
		return "", fmt.Errorf("uploading base image %s to pool %s on host %s: %w", img.BaseVol(), h.Pool, h.Name, uerr)
	case n != length:
		return "", provider.Errorf(provider.ErrTransient, "downloading image %s to host %s: the body ended after %d of %d bytes",
			urlForUsers(img.URL), h.Name, n, length)
	}
	return digest, nil
}

// writeMarker refreshes the pool, so libvirt reads the base's real format, and then
// records digest in the marker volume: the base is complete from this moment on.
func (c *Cache) writeMarker(b Storage, h provider.KVMHost, pool libvirt.StoragePool, img Image, digest string) error {
	if err := b.StoragePoolRefresh(pool, 0); err != nil {
		return fmt.Errorf("refreshing pool %s on host %s: %w", h.Pool, h.Name, err)
	}
	xml, err := c.volumeXML(img.MarkerVol(), MarkerLen)
	if err != nil {
		return provider.Permanent(err)
	}
	vol, err := b.StorageVolCreateXML(pool, xml, 0)
	if err != nil {
		return fmt.Errorf("creating image marker %s in pool %s on host %s: %w", img.MarkerVol(), h.Pool, h.Name, err)
	}
	if err := b.StorageVolUpload(vol, strings.NewReader(digest), 0, MarkerLen, 0); err != nil {
		if derr := b.StorageVolDelete(vol, 0); derr != nil {
			err = errors.Join(err, derr)
		}
		return fmt.Errorf("writing image marker %s in pool %s on host %s: %w", img.MarkerVol(), h.Pool, h.Name, err)
	}
	return nil
}

// reportProgress reports the download of img to the caller (provider.ReportProgress) and at
// V(1): once at the start, then at most every progressEvery while bytes arrive. The
// returned stop ends the reports; none is made after it returns.
func (c *Cache) reportProgress(ctx context.Context, log logr.Logger, h provider.KVMHost, img Image, src *SourceReader, total int64) (stop func()) {
	report := func(done int64) {
		msg := fmt.Sprintf("downloading base image %s to host %s: %s of %s (%d%%)",
			img.Key, h.Name, mib(done), mib(total), done*100/total)
		provider.ReportProgress(ctx, provider.Progress{Reason: provider.ReasonImageDownloading, Message: msg,
			Done: done, Total: total})
		log.V(1).Info("downloading base image", "done", done, "total", total)
	}
	report(0)
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		last := int64(0)
		t := time.NewTimer(c.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			if done := src.Done(); done != last {
				last = done
				report(done)
			}
			t.Reset(c.ProgressEvery)
		}
	}()
	return func() { close(quit); <-finished }
}

// mib formats a byte count for people.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// urlForUsers is rawURL as errors, events, status and log lines show it: without
// userinfo, query string and fragment (provider.RedactURL).
func urlForUsers(rawURL string) string { return provider.RedactURL(rawURL) }

// withoutURL replaces rawURL in msg, in every form an error may quote it, by its host.
// The longer forms go first: the redacted one is a prefix of rawURL.
func withoutURL(msg, rawURL string) string {
	forms := []string{rawURL}
	if u, err := url.Parse(rawURL); err == nil && u.User != nil {
		if _, has := u.User.Password(); has { // as net/http quotes it, and as url.Redacted does
			forms = append(forms, strings.Replace(u.String(), u.User.String()+"@", u.User.Username()+":***@", 1), u.Redacted())
		}
	}
	forms = append(forms, urlForUsers(rawURL))
	for _, f := range forms {
		msg = strings.ReplaceAll(msg, f, urlHost(rawURL))
	}
	return msg
}

// urlHost is the host of rawURL, the only part of it a span carries.
func urlHost(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	return u.Host
}
