package gce

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// callTracer opens the gce.<method> spans, one per API call.
var callTracer = otel.Tracer("gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce")

// target is what an API call is about.
type target struct{ zone, region, instance, firewall, operation string }

// call runs one API call: a client span gce.<method> and, when it ends, one V(1) line
// "gce call" naming the method, its object, the duration and on failure the error and
// its HTTP status. The call gets the provider's per-call deadline.
func (p *Provider) call(ctx context.Context, method string, t target, fn func(context.Context) error) error {
	attrs := []attribute.KeyValue{attribute.String("gce.project", p.cfg.Project)}
	kv := []any{"method", method}
	for _, f := range []struct{ key, v string }{
		{"zone", t.zone}, {"region", t.region}, {"instance", t.instance}, {"firewall", t.firewall}, {"operation", t.operation},
	} {
		if f.v != "" {
			attrs = append(attrs, attribute.String("gce."+f.key, f.v))
			kv = append(kv, f.key, f.v)
		}
	}
	ctx, span := callTracer.Start(ctx, "gce."+method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, p.callTimeout)
	defer cancel()
	start := time.Now()
	err := fn(ctx)
	kv = append(kv, "duration", time.Since(start))
	if err != nil {
		if code := httpCode(err); code != 0 {
			kv = append(kv, "httpCode", code)
			span.SetAttributes(attribute.Int("http.response.status_code", code))
		}
		kv = append(kv, "error", err.Error())
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	tracing.Logger(ctx, p.log).V(1).Info("gce call", kv...)
	return err
}

// wireVerbosity is the tier of the raw HTTP lines.
const wireVerbosity = 5

// wireLog is the innermost transport of the API clients. At V(5) it writes each request
// and response line with headers and body, Authorization (and any cookie) removed and
// every user-data metadata value replaced by its length.
type wireLog struct {
	base http.RoundTripper
	log  logr.Logger
}

func (w *wireLog) RoundTrip(req *http.Request) (*http.Response, error) {
	log := tracing.Logger(req.Context(), w.log).V(wireVerbosity)
	if !log.Enabled() {
		return w.base.RoundTrip(req)
	}
	var body []byte
	if req.Body != nil && req.GetBody != nil {
		if rc, err := req.GetBody(); err == nil {
			body, _ = io.ReadAll(rc)
			rc.Close()
		}
	}
	log.Info("gce http request", "method", req.Method, "url", req.URL.String(),
		"header", redactHeader(req.Header), "body", redactBody(body))
	start := time.Now()
	resp, err := w.base.RoundTrip(req)
	if err != nil {
		log.Info("gce http response", "method", req.Method, "url", req.URL.String(), "error", err.Error(), "duration", time.Since(start))
		return nil, err
	}
	respBody, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(respBody))
	kv := []any{"method", req.Method, "url", req.URL.String(), "status", resp.Status,
		"header", redactHeader(resp.Header), "body", redactBody(respBody), "duration", time.Since(start)}
	if rerr != nil {
		kv = append(kv, "error", rerr.Error())
	}
	log.Info("gce http response", kv...)
	return resp, nil
}

// secretHeaders are never logged.
var secretHeaders = map[string]bool{"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "Set-Cookie": true}

func redactHeader(h http.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if secretHeaders[http.CanonicalHeaderKey(k)] {
			out[k] = "[removed]"
			continue
		}
		if len(v) == 1 {
			out[k] = v[0]
		} else {
			out[k] = fmt.Sprint(v)
		}
	}
	return out
}

// redactBody returns a JSON body with every user-data metadata value replaced by
// "[removed N bytes]". A body that is not JSON is shown by its length only.
func redactBody(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Sprintf("[%d bytes, not JSON]", len(b))
	}
	out, err := json.Marshal(scrub(v))
	if err != nil {
		return fmt.Sprintf("[%d bytes]", len(b))
	}
	return string(out)
}

// scrub walks a decoded JSON value and removes the value of every {"key": "user-data",
// "value": ...} item.
func scrub(v any) any {
	switch t := v.(type) {
	case map[string]any:
		if k, _ := t["key"].(string); k == MetadataUserData {
			if s, ok := t["value"].(string); ok {
				t["value"] = fmt.Sprintf("[removed %d bytes]", len(s))
			} else if _, ok := t["value"]; ok {
				t["value"] = "[removed]"
			}
		}
		for k, e := range t {
			t[k] = scrub(e)
		}
	case []any:
		for i, e := range t {
			t[i] = scrub(e)
		}
	}
	return v
}
