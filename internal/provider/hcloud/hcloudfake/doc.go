// Package hcloudfake is an in-process Hetzner Cloud API: an httptest server speaking the
// REST protocol of https://api.hetzner.cloud/v1 (JSON bodies, the error envelope
// {"error":{"code","message","details"}}, meta.pagination, RateLimit-* headers,
// Authorization: Bearer) for the calls a provider of proxy VMs makes, so that the official
// client, github.com/hetznercloud/hcloud-go/v2, runs unchanged in tests: point it at
// Server.URL with hcloud.WithEndpoint and Token with hcloud.WithToken.
//
// What it serves: servers (create, get, list, update, delete, and the actions poweron,
// poweroff, shutdown, reboot and reset), actions (GET /actions/{id} and GET /actions?id=),
// firewalls (create, get, list, update, delete, and the actions set_rules,
// apply_to_resources and remove_from_resources), locations, server types, images,
// primary IPs (read only: each server gets auto-deleted ones at create) and GET /pricing.
// The datacenters endpoints answer 410 deprecated_api_endpoint, as the real API has
// since 1 October 2026; anything else is answered 404 not_found. Every answer carries an
// X-Correlation-Id.
//
// The action model: a call that changes something answers with actions in status
// "running"; an action finishes ("success", progress 100, finished set) at its
// SetActionPolls-th read, a read being a GET of the action (or a list naming its id) or of
// a resource it works on (the server, the firewall). A server is "initializing" while
// create_server runs, "starting" while start_server (its next action) runs and "running"
// after; "off" when created with start_after_create false; "deleting" while
// delete_server runs, and gone after it. A server or firewall with a running action is
// locked: another action on it gets 423 locked.
//
// A server's public_net.ipv6.ip is its /64 ("2001:db8:1::/64"), as the API sends it;
// the address the server itself takes is ::1 of it, which Hetzner's images configure and
// the fake does not show anywhere else. public_net.ipv4 (and ipv6) is null for a server
// created without it.
//
// What it refuses as the real API does: a name that is not an RFC 1123 host name (servers)
// or is taken (uniqueness_error, 409); labels breaking the key/value syntax; a label
// selector it cannot parse; user_data over 32 KiB (invalid_input); an unknown server
// type, image or location (invalid_input); an image of the other architecture; a server
// type that cannot be ordered in the location, or whose deprecation has passed its
// unavailable_after (412 resource_unavailable "error during placement", as users of the
// API report it); more servers, firewalls or primary IPs than the Quota
// (resource_limit_exceeded); firewall rules with a bad direction, protocol, port or CIDR,
// or more than 50; deleting a firewall still applied (resource_in_use); applying one
// twice (firewall_already_applied); removing one from a server it is not applied to
// (firewall_resource_not_found) or that a label selector covers
// (firewall_managed_by_label_selector); GET /actions without id (invalid_input, since
// 30 January 2025); an unknown token (401 unauthorized); a write with a read-only token
// (403 forbidden); requests beyond the rate limit (429 rate_limit_exceeded with
// RateLimit-Reset).
//
// Faults for tests: Fail queues an error for the next call of a route, synchronous (any
// code and status, RateLimit-Reset for 429) or an accepted call whose action ends in
// error; HoldStarting keeps a server "starting"; SetLatency delays answers;
// SetRateLimit; SetTokens; Calls and CallCount count what was called. State is read
// and seeded with Servers, ServerByName, SeedServer, RemoveServer, SetServerStatus,
// UserData, Action, Firewalls, RemoveFirewall, PrimaryIPs, Quota, SetQuota,
// SetActionPolls, SetLocation, SetServerType, SetAvailable, SetImage and
// SetPrimaryIPPrices; addresses come from 203.0.113.0/24 and 2001:db8::/32 unless
// SetIPv4Address and SetIPv6Network say otherwise.
//
// Sources it was checked against: hcloud-go v2.52.0 (the version in go.mod), its
// hcloud/schema package (every request and response body: server.go, action.go,
// firewall.go, location.go, server_type.go, image.go, primary_ip.go, pricing.go,
// deprecation.go, meta.go, error.go, id_or_name.go), hcloud/error.go (the error codes),
// client_handler_error.go, client_handler_parse.go and client_handler_rate_limit.go (how
// the envelope, meta.pagination and the RateLimit headers are read),
// client_handler_retry.go (which codes the client retries: conflict,
// rate_limit_exceeded, timeout, bad_gateway), action.go and action_waiter.go (how actions
// are polled: GET /actions?id=..&sort=status&sort=id), server.go, firewall.go,
// image.go and client.go (paths and query parameters: page, per_page, label_selector,
// name, status, sort, architecture, include_deprecated), labels.go (the label syntax)
// and client_helper.go (how pages are followed: meta.pagination.next_page). The HTTP
// status of each error code, the 32 KiB user_data limit, the 50-rule firewall limit and
// the label-selector grammar are from the API reference at https://docs.hetzner.cloud/
// as known to the authors (the docs site cannot be reached from the build machine), and
// the sold-out answer from what users of the API report in public issue trackers
// ("error during placement (resource_unavailable, <correlation id>)"); see StatusOf.
// hcloud-go's CHANGELOG.md gave the removals (datacenters, listing all actions,
// firewall_already_removed, the type-wide server type deprecation). Known gaps:
// docs/testing.md, the hcloud fake.
package hcloudfake
