#!/usr/bin/env python3
"""Loads the Envoy files proxy-sync wrote with Envoy's own API definitions (the xds-protos package).

Usage: check_envoy.py DIR

Each of lds.json, rds.json and cds.json must parse as an envoy.service.discovery.v3.DiscoveryResponse
whose resources are Listeners, RouteConfigurations and Clusters (the typed_config inside a listener
resolved to its extension's message), and bootstrap.json as an envoy.config.bootstrap.v3.Bootstrap.
Parsing is strict: an unknown field, a wrong type or an unknown @type fails. Prints one JSON line with
what was found (for the calling test to compare with what it wrote); exits 1 with the parser's message
on the first problem, 3 when xds-protos is not installed.
"""

import json
import sys

try:
    from google.protobuf import json_format
    from envoy.config.bootstrap.v3 import bootstrap_pb2
    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.config.listener.v3 import listener_pb2
    from envoy.config.route.v3 import route_pb2
    from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
    from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401 (registers the type)
    from envoy.extensions.filters.network.http_connection_manager.v3 import (
        http_connection_manager_pb2 as hcm_pb2,
    )
    from envoy.service.discovery.v3 import discovery_pb2
except ImportError as e:  # pragma: no cover - the calling test explains what to install
    print(f"xds-protos is not installed ({e}); pip install xds-protos", file=sys.stderr)
    sys.exit(3)

EXPECTED = {
    "lds.json": ("type.googleapis.com/envoy.config.listener.v3.Listener", listener_pb2.Listener),
    "rds.json": ("type.googleapis.com/envoy.config.route.v3.RouteConfiguration", route_pb2.RouteConfiguration),
    "cds.json": ("type.googleapis.com/envoy.config.cluster.v3.Cluster", cluster_pb2.Cluster),
}


def load(path):
    with open(path) as f:
        return json.load(f)


def main(directory):
    found = {}
    boot = bootstrap_pb2.Bootstrap()
    json_format.ParseDict(load(f"{directory}/bootstrap.json"), boot)
    found["bootstrap_lds"] = boot.dynamic_resources.lds_config.path_config_source.path
    found["bootstrap_cds"] = boot.dynamic_resources.cds_config.path_config_source.path
    messages = {}
    for name, (type_url, cls) in EXPECTED.items():
        response = discovery_pb2.DiscoveryResponse()
        json_format.ParseDict(load(f"{directory}/{name}"), response)
        out = []
        for any_resource in response.resources:
            if any_resource.type_url != type_url:
                raise ValueError(f"{name}: a resource of type {any_resource.type_url}, expected {type_url}")
            message = cls()
            if not any_resource.Unpack(message):
                raise ValueError(f"{name}: a resource does not unpack as {type_url}")
            out.append(message)
        messages[name] = out
    (listener,) = messages["lds.json"]
    hcm = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(hcm)
    found["listener_port"] = listener.address.socket_address.port_value
    found["upgrades"] = [u.upgrade_type for u in hcm.upgrade_configs]
    found["rds_path"] = hcm.rds.config_source.path_config_source.path
    found["rds_name"] = hcm.rds.route_config_name
    found["filters"] = [f.name for f in hcm.http_filters]
    for f in hcm.http_filters:
        if f.name == "envoy.filters.http.ext_authz":
            authz = ext_authz_pb2.ExtAuthz()
            if not f.typed_config.Unpack(authz):
                raise ValueError("the ext_authz filter's typed_config is not an ExtAuthz")
            http = authz.http_service
            found["authz"] = {
                "uri": http.server_uri.uri,
                "cluster": http.server_uri.cluster,
                "path_prefix": http.path_prefix,
                "headers": [p.exact or f"prefix:{p.prefix}" for p in authz.allowed_headers.patterns],
                "upstream_headers": [
                    f"prefix {p.prefix}" if p.prefix else f"exact {p.exact}"
                    for p in http.authorization_response.allowed_upstream_headers.patterns
                ],
                "failure_mode_allow": authz.failure_mode_allow,
            }
    (routes,) = messages["rds.json"]
    found["route_config_name"] = routes.name
    # Where each host's other paths go (its last route, the catch-all "/"): a cluster, or the status
    # Envoy answers itself with (a bridges-only host).
    def catch_all(route):
        if route.HasField("direct_response"):
            return f"direct_response {route.direct_response.status}"
        return route.route.cluster

    found["hosts"] = {vh.domains[0]: catch_all(vh.routes[-1]) for vh in routes.virtual_hosts}
    # What each pod route removes from the request before the pod (the check's own headers).
    removed = {
        vh.domains[0]: list(vh.routes[-1].request_headers_to_remove)
        for vh in routes.virtual_hosts
        if vh.routes[-1].request_headers_to_remove
    }
    if removed:
        found["removed_for_pod"] = removed
    bridged = {
        vh.domains[0]: r.route.cluster
        for vh in routes.virtual_hosts
        for r in vh.routes
        if r.match.prefix == "/.volcano-runner/"
    }
    if bridged:
        found["bridge_routes"] = bridged
    found["clusters"] = {
        c.name: [
            f"{e.endpoint.address.socket_address.address}:{e.endpoint.address.socket_address.port_value}"
            for locality in c.load_assignment.endpoints
            for e in locality.lb_endpoints
        ]
        for c in messages["cds.json"]
    }
    print(json.dumps(found, sort_keys=True))


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except Exception as e:  # noqa: BLE001 - any parse problem is the answer
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
