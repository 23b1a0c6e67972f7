//! The HTTP face of the simulator: routing of Kubernetes API paths, query parameters, content
//! negotiation (JSON, Table, PartialObjectMetadata, aggregated discovery), watch streams, pod logs, and
//! fault injection in front of it all.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::sim::json::JsonPath;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::api::{
    DeleteOptions, Deleted, EntryPage, ListOptions, ListPage, Propagation, Subresource,
    WriteOptions, Written, name_of,
};
use super::clock::SimClock;
use super::cluster::Cluster;
use super::discovery;
use super::encode::{
    EventType, Record, stamped, watch_line, write_object, write_partial_from,
    write_partial_metadata,
};
use super::error::ApiError;
use super::faults::Faults;
use super::history::Change;
use super::patch::PatchKind;
use super::registry::{Builtin, ResId, ResourceType};
use super::selector::{FieldSelector, LabelSelector};
use super::store::Entry;
use super::table;

/// Settings the HTTP layer needs.
#[derive(Debug, Clone)]
pub(crate) struct ServerSettings {
    pub watch_timeout: Duration,
    pub bookmark_interval: Duration,
    pub default_run: Duration,
    pub address: String,
}

/// State shared by every request, the ticker and the handle.
pub(crate) struct Shared {
    cluster: Mutex<Cluster>,
    pub clock: Arc<SimClock>,
    pub faults: Arc<Faults>,
    changed: watch::Sender<u64>,
    /// Per resource storage: bumped when a write changed that kind, so a watch wakes for its own kind
    /// only (a pod's status change does not wake every watch of nodes, configmaps and jobs).
    changed_by_res: Mutex<Vec<watch::Sender<u64>>>,
    /// The simulated instant (ns) of the timer the ticker sleeps towards (`i64::MAX`: none). Written
    /// and read under the cluster's lock: a write wakes the ticker only when it made an earlier timer.
    ticker_due: AtomicI64,
    /// Bumped to cut every open watch (a test hook for dropped connections).
    cuts: watch::Sender<u64>,
    wake_ticker: Notify,
    pub shutdown: CancellationToken,
    pub settings: ServerSettings,
    /// API requests served, by `<verb> <resource>` (e.g. `create jobs.batch.volcano.sh`, `list pods`,
    /// `patch jobs.batch.volcano.sh/status`): what a benchmark reports per job, and the measure of the
    /// load a real API server would carry.
    requests: Mutex<BTreeMap<String, u64>>,
    /// How long the cluster's lock has been held, in nanoseconds: every request and every controller
    /// step runs under it, so its share of real time says when the simulator, not its clients, is what
    /// a load is bound by (the benchmark prints it per phase).
    held_ns: AtomicU64,
}

impl Shared {
    /// Shared state around a settled cluster.
    pub fn new(
        cluster: Cluster,
        clock: Arc<SimClock>,
        faults: Arc<Faults>,
        shutdown: CancellationToken,
        settings: ServerSettings,
    ) -> Self {
        let rv = cluster.core.store.resource_version();
        Shared {
            cluster: Mutex::new(cluster),
            clock,
            faults,
            changed: watch::channel(rv).0,
            changed_by_res: Mutex::new(Vec::new()),
            ticker_due: AtomicI64::new(i64::MAX),
            cuts: watch::channel(0).0,
            wake_ticker: Notify::new(),
            shutdown,
            settings,
            requests: Mutex::new(BTreeMap::new()),
            held_ns: AtomicU64::new(0),
        }
    }

    /// Counts one API request.
    fn count_request(&self, kind: String) {
        *self
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(kind)
            .or_default() += 1;
    }

    /// API requests served so far, by `<verb> <resource>`.
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The cluster, locked; the time it is held is counted when it is let go ([`Locked`]).
    fn lock(&self) -> Locked<'_> {
        Locked {
            guard: self.cluster.lock().unwrap_or_else(PoisonError::into_inner),
            since: Instant::now(),
            held_ns: &self.held_ns,
        }
    }

    /// How long the cluster's lock has been held since the simulator started.
    pub fn lock_held(&self) -> Duration {
        Duration::from_nanos(self.held_ns.load(Ordering::Relaxed))
    }

    /// Runs `f` on the cluster at the current simulated instant, then lets the controllers settle and
    /// wakes watches.
    pub fn with<R>(&self, f: impl FnOnce(&mut Cluster) -> R) -> R {
        let mut c = self.lock();
        let now = self.clock.now();
        c.advance_to(now);
        let r = f(&mut c);
        c.settle();
        let rv = c.core.store.resource_version();
        let touched = c.core.store.take_touched();
        let earlier_timer = c
            .next_timer()
            .is_some_and(|t| nanos(t) < self.ticker_due.load(Ordering::Relaxed));
        drop(c);
        self.notify(rv, &touched);
        if earlier_timer {
            self.wake_ticker.notify_one();
        }
        r
    }

    /// A write through the API, with the history record it made (see [`record_of`]) so that its
    /// answer is the encoding the watches send.
    fn write(
        &self,
        f: impl FnOnce(&mut Cluster) -> Result<Written, ApiError>,
    ) -> Result<(Written, Option<Arc<Record>>), ApiError> {
        self.with(|c| {
            let w = f(c)?;
            let record = record_of(c, &w.object);
            Ok((w, record))
        })
    }

    /// Reads the cluster without moving time (watch streams use this).
    pub fn read<R>(&self, f: impl FnOnce(&Cluster) -> R) -> R {
        f(&self.lock())
    }

    fn notify(&self, rv: u64, touched: &[ResId]) {
        bump(&self.changed, rv);
        if touched.is_empty() {
            return;
        }
        let by_res = self
            .changed_by_res
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for &res in touched {
            if let Some(tx) = by_res.get(res) {
                bump(tx, rv);
            }
        }
    }

    /// Wakes on every change (its value is the latest resourceVersion).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Wakes on every change of the kind stored in `res`.
    fn subscribe_res(&self, res: ResId) -> watch::Receiver<u64> {
        let mut by_res = self
            .changed_by_res
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if by_res.len() <= res {
            by_res.resize_with(res + 1, || watch::channel(0).0);
        }
        by_res[res].subscribe()
    }

    /// The clock's speed or instant changed: the ticker works out its sleep again, whatever its timer.
    pub fn clock_changed(&self) {
        self.wake_ticker.notify_one();
    }

    /// Drops every open watch connection, as a network failure or an API server restart does.
    pub fn cut_watches(&self) {
        self.cuts.send_modify(|g| *g += 1);
    }
}

/// The cluster's lock, held: adds the time it was held to [`Shared::lock_held`] as it is let go.
struct Locked<'a> {
    guard: MutexGuard<'a, Cluster>,
    since: Instant,
    held_ns: &'a AtomicU64,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.guard
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.guard
    }
}

impl Drop for Locked<'_> {
    /// Counted before the guard itself is dropped (after this), not after: letting the lock go wakes
    /// the next holder, whose time would then overlap this one's.
    fn drop(&mut self) {
        let ns = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.held_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Fires the model's timers as a running clock passes them. Ends on shutdown.
pub(crate) async fn ticker(shared: Arc<Shared>) {
    loop {
        let next = shared.read(|c| {
            let next = c.next_timer();
            shared
                .ticker_due
                .store(next.map_or(i64::MAX, nanos), Ordering::Relaxed);
            next
        });
        let wait = next
            .and_then(|t| shared.clock.real_until(t))
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait.min(Duration::from_secs(1))) => {
                if shared.clock.speed() > 0.0 {
                    shared.with(|_| ());
                }
            }
            _ = shared.wake_ticker.notified() => {}
        }
    }
}

/// Sets a change channel to `rv`, waking its receivers when that is news.
fn bump(tx: &watch::Sender<u64>, rv: u64) {
    tx.send_if_modified(|v| {
        if *v != rv {
            *v = rv;
            true
        } else {
            false
        }
    });
}

/// A simulated instant in nanoseconds, saturated to `i64` (the ticker's due time).
fn nanos(t: Timestamp) -> i64 {
    i64::try_from(t.as_nanosecond()).unwrap_or(i64::MAX)
}

// ----- parameters -----

struct Params(Vec<(String, String)>);

impl Params {
    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }

    fn list_options(&self, t: &ResourceType) -> Result<ListOptions, ApiError> {
        let label = LabelSelector::parse(self.get("labelSelector").unwrap_or_default())
            .map_err(ApiError::bad_request)?;
        let field = FieldSelector::parse(
            self.get("fieldSelector").unwrap_or_default(),
            &t.field_selectors,
        )
        .map_err(ApiError::bad_request)?;
        let limit = match self.get("limit") {
            Some(l) => Some(
                l.parse::<usize>()
                    .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))?,
            ),
            None => None,
        };
        let continue_token = self
            .get("continue")
            .filter(|c| !c.is_empty())
            .map(String::from);
        Ok(ListOptions {
            label,
            field,
            limit,
            continue_token,
        })
    }

    fn write_options(&self) -> WriteOptions {
        WriteOptions {
            dry_run: self.get("dryRun") == Some("All"),
            field_manager: self
                .get("fieldManager")
                .filter(|m| !m.is_empty())
                .map(String::from),
            strict: self.get("fieldValidation") == Some("Strict"),
            force: self.flag("force"),
        }
    }
}

// ----- responses -----

fn respond(code: u16, content_type: &str, body: impl Into<Bytes>) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body.into()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn json_response(code: u16, v: &Value) -> Response {
    respond(
        code,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

pub(crate) fn error_response(e: &ApiError) -> Response {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        if let Ok(v) = HeaderValue::from_str(&format!("299 - {w:?}")) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

/// How the client wants objects represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repr {
    Json,
    Table,
    Metadata,
}

fn repr(headers: &HeaderMap) -> Repr {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let first = accept.split(',').next().unwrap_or_default();
    if first.contains("as=Table") {
        Repr::Table
    } else if first.contains("as=PartialObjectMetadata") {
        Repr::Metadata
    } else {
        Repr::Json
    }
}

/// `obj` as a `PartialObjectMetadata`, in JSON.
fn partial(obj: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    write_partial_metadata(&mut out, obj, None);
    out
}

fn object_response(
    code: u16,
    t: &ResourceType,
    obj: &Arc<Value>,
    r: Repr,
    now: jiff::Timestamp,
    rv: u64,
) -> Response {
    match r {
        Repr::Json => respond(
            code,
            "application/json",
            serde_json::to_vec(&**obj).unwrap_or_default(),
        ),
        Repr::Metadata => respond(code, "application/json", partial(obj)),
        Repr::Table => json_response(
            code,
            &table::to_table(t, std::slice::from_ref(obj), now, rv, None, "Metadata"),
        ),
    }
}

/// A written object as JSON, whole or as its `PartialObjectMetadata` (writes do not negotiate tables).
/// With the write's record the encoding is the one its watch events carry: the object is written out
/// once, not once for the answer and once for the watches.
fn written(code: u16, obj: &Value, record: Option<&Record>, r: Repr) -> Response {
    let metadata = r == Repr::Metadata;
    let body = match record {
        Some(rec) => rec.object_json(metadata),
        None if metadata => Bytes::from(partial(obj)),
        None => Bytes::from(serde_json::to_vec(obj).unwrap_or_default()),
    };
    respond(code, "application/json", body)
}

/// The answer to a write: the written object, with its record's encoding when there is one; its
/// `PartialObjectMetadata` when the request asked for that (`Accept: application/json;
/// as=PartialObjectMetadata;g=meta.k8s.io;v=v1`), as an API server answers a create, an update or a
/// patch in the representation the request negotiated. A client that reads only the metadata of what
/// it wrote (the runner's creates) is spared the whole object.
fn answer(code: u16, (w, record): (Written, Option<Arc<Record>>), r: Repr) -> Response {
    with_warnings(written(code, &w.object, record.as_deref(), r), &w.warnings)
}

/// The history record of the write that stored `obj`, when it is the latest change (read inside the
/// write's lock, before the controllers react).
fn record_of(c: &Cluster, obj: &Arc<Value>) -> Option<Arc<Record>> {
    c.core
        .store
        .latest()
        .filter(|r| r.sends_as_stored() && Arc::ptr_eq(&r.object, obj))
        .cloned()
}

fn list_response(
    t: &ResourceType,
    page: &ListPage,
    r: Repr,
    now: jiff::Timestamp,
    include: &str,
) -> Response {
    if r == Repr::Table {
        return json_response(
            200,
            &table::to_table(
                t,
                &page.items,
                now,
                page.resource_version,
                page.continue_token.as_deref(),
                include,
            ),
        );
    }
    let mut out = Vec::with_capacity(256 + page.items.len() * 1024);
    list_head(
        &mut out,
        t,
        r,
        page.resource_version,
        page.continue_token.as_deref(),
    );
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match r {
            Repr::Metadata => write_partial_metadata(&mut out, item, None),
            _ => {
                let _ = serde_json::to_writer(&mut out, &**item);
            }
        }
    }
    out.extend_from_slice(b"]}");
    respond(200, "application/json", out)
}

// ----- routing -----

#[derive(Debug, Clone)]
struct ResourcePath {
    group: String,
    version: String,
    namespace: Option<String>,
    plural: String,
    name: Option<String>,
    sub: Option<String>,
}

enum Route {
    Version,
    /// `GET /sim/v1/clock`: the simulated time and its speed, so a runner pointed at this simulator by
    /// URL uses its clock rather than the wall clock.
    Clock,
    /// `GET /sim/v1/connection`: whether the NetworkPolicies let one pod or address connect to another
    /// ([`super::netpol`]).
    Connection,
    Health,
    Api,
    Apis,
    Group(String),
    GroupVersion(String, String),
    OpenApiRoot,
    OpenApi(String, String),
    /// `GET /openapi/v2`: an empty Swagger 2.0 document, which older kubectl (Debian 12's 1.20) reads
    /// before `apply`; with no definitions it leaves validation to the server, as for any custom resource.
    OpenApiV2,
    Resource(ResourcePath),
}

fn parse_resource(group: &str, version: &str, rest: &[&str]) -> Option<ResourcePath> {
    let mk = |ns: Option<&str>, plural: &str, name: Option<&str>, sub: Option<&str>| ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        namespace: ns.map(String::from),
        plural: plural.to_string(),
        name: name.map(String::from),
        sub: sub.map(String::from),
    };
    match rest {
        ["namespaces", ns, plural] if !matches!(*plural, "status" | "finalize") => {
            Some(mk(Some(ns), plural, None, None))
        }
        ["namespaces", ns, plural, name] => Some(mk(Some(ns), plural, Some(name), None)),
        ["namespaces", ns, plural, name, sub] => Some(mk(Some(ns), plural, Some(name), Some(sub))),
        [plural] => Some(mk(None, plural, None, None)),
        [plural, name] => Some(mk(None, plural, Some(name), None)),
        [plural, name, sub] => Some(mk(None, plural, Some(name), Some(sub))),
        _ => None,
    }
}

fn parse_route(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Some(Route::Version),
        ["sim", "v1", "clock"] => Some(Route::Clock),
        ["sim", "v1", "connection"] => Some(Route::Connection),
        ["openapi", "v2"] => Some(Route::OpenApiV2),
        ["openapi", "v3"] => Some(Route::OpenApiRoot),
        ["openapi", "v3", "api", v] => Some(Route::OpenApi(String::new(), v.to_string())),
        ["openapi", "v3", "apis", g, v] => Some(Route::OpenApi(g.to_string(), v.to_string())),
        ["healthz" | "livez" | "readyz", ..] => Some(Route::Health),
        ["api"] => Some(Route::Api),
        ["api", "v1"] => Some(Route::GroupVersion(String::new(), "v1".into())),
        ["api", "v1", rest @ ..] => parse_resource("", "v1", rest).map(Route::Resource),
        ["apis"] => Some(Route::Apis),
        ["apis", g] => Some(Route::Group(g.to_string())),
        ["apis", g, v] => Some(Route::GroupVersion(g.to_string(), v.to_string())),
        ["apis", g, v, rest @ ..] => parse_resource(g, v, rest).map(Route::Resource),
        _ => None,
    }
}

/// `<verb> <plural>[.<group>][/<subresource>]`, as the request counts name it.
fn request_kind(verb: &str, p: &ResourcePath) -> String {
    let mut kind = format!("{verb} {}", p.plural);
    if !p.group.is_empty() {
        kind.push('.');
        kind.push_str(&p.group);
    }
    if let Some(sub) = &p.sub {
        kind.push('/');
        kind.push_str(sub);
    }
    kind
}

fn verb_of(method: &Method, p: &ResourcePath, params: &Params) -> &'static str {
    match (method.as_str(), p.name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if params.flag("watch") => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// The single handler behind every path.
pub(crate) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params = Params(
        Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map(|q| q.0)
            .unwrap_or_default(),
    );
    let Some(route) = parse_route(uri.path()) else {
        return error_response(&ApiError::no_route(uri.path()));
    };
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if !matches!(route, Route::Resource(_))
        && let Some(e) = shared.faults.unavailable_now()
    {
        return error_response(&e);
    }
    if matches!(route, Route::Connection) {
        let get = |k: &str| params.get(k).map(str::to_owned);
        return match shared.read(|c| super::netpol::answer(&c.core, get)) {
            Ok(v) => json_response(200, &v),
            Err(e) => error_response(&e),
        };
    }
    let Route::Resource(p) = route else {
        return discovery_response(&shared, route, &accept, uri.path());
    };
    resource_request(&shared, &method, &p, &params, &headers, body).await
}

/// The paths that are not resources: version, the simulator's clock, health, OpenAPI and discovery
/// (aggregated when the client asks for `apidiscovery.k8s.io` v2 first).
fn discovery_response(shared: &Shared, route: Route, accept: &str, path: &str) -> Response {
    let aggregated = accept.contains("apidiscovery.k8s.io")
        && accept.split(',').next().is_some_and(|a| a.contains("v=v2"));
    match route {
        Route::Version => json_response(200, &discovery::version()),
        Route::Clock => json_response(
            200,
            &serde_json::json!({
                "now": shared.clock.now().to_string(),
                "speed": shared.clock.speed(),
            }),
        ),
        Route::Health => respond(200, "text/plain", b"ok".to_vec()),
        // Answered by `handle`, which has the query.
        Route::Connection => error_response(&ApiError::no_route(path)),
        Route::OpenApiV2 if accept.contains("protobuf") => respond(
            200,
            "application/octet-stream",
            discovery::openapi_v2_protobuf(),
        ),
        Route::OpenApiV2 => json_response(200, &discovery::openapi_v2()),
        Route::OpenApiRoot => json_response(
            200,
            &shared.read(|c| discovery::openapi_v3_root(&c.core.registry)),
        ),
        Route::OpenApi(g, v) => {
            match shared.read(|c| discovery::openapi_v3_group_version(&c.core.registry, &g, &v)) {
                Some(doc) => json_response(200, &doc),
                None => error_response(&ApiError::no_route(path)),
            }
        }
        Route::Api if aggregated => {
            let v = shared.read(|c| discovery::aggregated(&c.core.registry, true));
            respond(
                200,
                discovery::AGGREGATED_CONTENT_TYPE,
                serde_json::to_vec(&v).unwrap_or_default(),
            )
        }
        Route::Api => json_response(200, &discovery::api_versions(&shared.settings.address)),
        Route::Apis if aggregated => {
            let v = shared.read(|c| discovery::aggregated(&c.core.registry, false));
            respond(
                200,
                discovery::AGGREGATED_CONTENT_TYPE,
                serde_json::to_vec(&v).unwrap_or_default(),
            )
        }
        Route::Apis => json_response(
            200,
            &shared.read(|c| discovery::api_group_list(&c.core.registry)),
        ),
        Route::Group(g) => match shared.read(|c| discovery::api_group(&c.core.registry, &g)) {
            Some(v) => json_response(200, &v),
            None => error_response(&ApiError::no_route(path)),
        },
        Route::GroupVersion(g, v) => {
            match shared.read(|c| discovery::api_resource_list(&c.core.registry, &g, &v)) {
                Some(v) => json_response(200, &v),
                None => error_response(&ApiError::no_route(path)),
            }
        }
        // Served by `resource_request`; not routed here.
        Route::Resource(_) => error_response(&ApiError::no_route(path)),
    }
}

/// A request on a resource: counted, then delayed or failed as the fault plan decides, then served.
async fn resource_request(
    shared: &Arc<Shared>,
    method: &Method,
    p: &ResourcePath,
    params: &Params,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let verb = verb_of(method, p, params);
    shared.count_request(request_kind(verb, p));
    let decision = shared
        .faults
        .decide(verb, &p.plural, &p.group, p.sub.as_deref());
    if !decision.latency.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(decision.latency) => {}
            _ = shared.shutdown.cancelled() => return error_response(&ApiError::unavailable("shutting down", None)),
        }
    }
    if let Some(e) = &decision.error {
        return error_response(e);
    }
    match resource(shared, method, p, params, headers, body, &decision) {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

fn resolve(shared: &Shared, p: &ResourcePath) -> Result<(ResId, Arc<ResourceType>), ApiError> {
    shared.read(|c| {
        let id = c
            .core
            .registry
            .lookup(&p.group, &p.version, &p.plural)
            .ok_or_else(|| {
                ApiError::no_route(&format!("{}/{}/{}", p.group, p.version, p.plural))
            })?;
        let t = c.core.registry.get(id);
        if p.namespace.is_some() && !t.namespaced {
            return Err(ApiError::no_route(&p.plural));
        }
        if p.namespace.is_none() && t.namespaced && p.name.is_some() {
            return Err(ApiError::no_route(&p.plural));
        }
        Ok((id, t))
    })
}

/// A create's or update's body, as its `Content-Type` says: JSON (also when none is given, as the API server
/// assumes) or YAML. Anything else, protobuf included (`application/vnd.kubernetes.protobuf`, which a real
/// API server speaks for built-in kinds and the simulator does not), is a 415 naming the type it got,
/// rather than a JSON decode error about bytes that were never JSON.
fn parse_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let media = ct.split(';').next().unwrap_or_default().trim();
    match media.to_ascii_lowercase().as_str() {
        "" | "application/json" | "*/*" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("error decoding the request body as JSON: {e}"))
        }),
        "application/yaml"
        | "application/x-yaml"
        | "text/yaml"
        | "application/apply-patch+yaml" => serde_yaml_ng::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}"))),
        _ => Err(ApiError::unsupported_media_type(
            ct,
            &["application/json", "application/yaml"],
        )),
    }
}

fn delete_options(params: &Params, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions::default();
    if !body.is_empty() {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            opts.propagation = Some(Propagation::parse(p)?);
        }
        if v.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
            opts.propagation = Some(Propagation::Orphan);
        }
        opts.grace_seconds = v.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.precondition_uid = v
            .at("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from);
        opts.precondition_rv = v
            .at("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from);
        opts.dry_run = v
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All"));
    }
    if let Some(p) = params.get("propagationPolicy") {
        opts.propagation = Some(Propagation::parse(p)?);
    }
    if let Some(g) = params.get("gracePeriodSeconds") {
        opts.grace_seconds =
            Some(g.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid gracePeriodSeconds: {g:?}"))
            })?);
    }
    if params.get("dryRun") == Some("All") {
        opts.dry_run = true;
    }
    Ok(opts)
}

fn resource(
    shared: &Arc<Shared>,
    method: &Method,
    p: &ResourcePath,
    params: &Params,
    headers: &HeaderMap,
    body: Bytes,
    decision: &super::faults::Decision,
) -> Result<Response, ApiError> {
    let (id, t) = resolve(shared, p)?;
    let ns = p.namespace.clone().unwrap_or_default();
    let r = repr(headers);
    let sub = match p.sub.as_deref() {
        None => Subresource::Main,
        Some("status") if t.status_subresource => Subresource::Status,
        Some("log") if t.builtin == Some(Builtin::Pod) && method == Method::GET => {
            return pod_log(shared, p, &ns, params);
        }
        Some("eviction") if t.builtin == Some(Builtin::Pod) && method == Method::POST => {
            return evict(shared, id, &ns, p.name.as_deref().unwrap_or_default());
        }
        Some(other) => return Err(ApiError::no_route(&format!("{}/{other}", t.plural))),
    };
    match (method.as_str(), &p.name) {
        ("GET", Some(name)) => shared.with(|c| {
            // An object kept as text is sent as that text (not parsed to be written out again).
            if r != Repr::Table
                && let Some(entry) = c
                    .core
                    .store
                    .entry(&c.core.key_of(id, &ns, name))
                    .filter(|e| e.text_metadata().is_some())
            {
                let mut out = Vec::new();
                write_entry(&mut out, entry, &t.api_version(), r == Repr::Metadata);
                return Ok(respond(200, "application/json", out));
            }
            let obj = c.core.get(id, &ns, name)?;
            Ok(object_response(
                200,
                &t,
                &obj,
                r,
                c.core.now,
                c.core.store.resource_version(),
            ))
        }),
        ("GET", None) if params.flag("watch") => {
            start_watch(shared, id, &t, p.namespace.clone(), params, r, decision)
        }
        ("GET", None) => list(shared, id, &t, p, params, r),
        ("POST", None) => {
            if t.namespaced && p.namespace.is_none() {
                return Err(ApiError::method_not_allowed(format!(
                    "POST is not supported on the cluster-wide collection of {}",
                    t.plural
                )));
            }
            let body = parse_body(headers, &body)?;
            let opts = params.write_options();
            let w = shared.write(|c| c.core.create(id, &ns, body, &opts))?;
            Ok(answer(201, w, r))
        }
        ("PUT", Some(name)) => {
            let body = parse_body(headers, &body)?;
            let opts = params.write_options();
            let w = shared.write(|c| c.core.update(id, &ns, name, body, sub, &opts))?;
            Ok(answer(200, w, r))
        }
        ("PATCH", Some(name)) => {
            let kind = patch_kind(headers)?;
            let opts = params.write_options();
            let w = shared.write(|c| c.core.patch(id, &ns, name, kind, &body, sub, &opts))?;
            let code = if w.0.created { 201 } else { 200 };
            Ok(answer(code, w, r))
        }
        ("DELETE", Some(name)) => {
            let opts = delete_options(params, &body)?;
            let d = shared.with(|c| c.core.delete(id, &ns, name, &opts))?;
            Ok(deleted_response(&t, d))
        }
        ("DELETE", None) => delete_collection(shared, id, &t, p, params, &body),
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method})"
        ))),
    }
}

/// A list, or a Table of it when asked for one.
fn list(
    shared: &Shared,
    id: ResId,
    t: &ResourceType,
    p: &ResourcePath,
    params: &Params,
    r: Repr,
) -> Result<Response, ApiError> {
    let opts = params.list_options(t)?;
    if r != Repr::Table {
        let page = shared.with(|c| c.core.list_entries(id, p.namespace.as_deref(), &opts))?;
        return Ok(entries_response(t, &page, r));
    }
    let (page, now) = shared.with(|c| {
        c.core
            .list(id, p.namespace.as_deref(), &opts)
            .map(|pg| (pg, c.core.now))
    })?;
    Ok(list_response(
        t,
        &page,
        r,
        now,
        params.get("includeObject").unwrap_or("Metadata"),
    ))
}

/// A list's text up to its items: its type (a metadata list's own, or the resource's list kind) and
/// its metadata (version, and where the next page starts).
fn list_head(
    out: &mut Vec<u8>,
    t: &ResourceType,
    r: Repr,
    resource_version: u64,
    continue_token: Option<&str>,
) {
    let (api_version, kind) = match r {
        Repr::Metadata => (
            "meta.k8s.io/v1".to_string(),
            "PartialObjectMetadataList".to_string(),
        ),
        _ => (t.api_version(), t.list_kind.clone()),
    };
    let mut meta = json!({"resourceVersion": resource_version.to_string()});
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
    }
    out.extend_from_slice(b"{\"apiVersion\":");
    let _ = serde_json::to_writer(&mut *out, &api_version);
    out.extend_from_slice(b",\"kind\":");
    let _ = serde_json::to_writer(&mut *out, &kind);
    out.extend_from_slice(b",\"metadata\":");
    let _ = serde_json::to_writer(&mut *out, &meta);
    out.extend_from_slice(b",\"items\":[");
}

/// A list (whole objects or their metadata) as the store holds it: an object kept as text is sent
/// as that text, or its metadata cut from it; a tree is written out.
fn entries_response(t: &ResourceType, page: &EntryPage, r: Repr) -> Response {
    let mut out = Vec::with_capacity(256 + page.entries.len() * 1024);
    list_head(
        &mut out,
        t,
        r,
        page.resource_version,
        page.continue_token.as_deref(),
    );
    let served = t.api_version();
    for (i, entry) in page.entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_entry(&mut out, entry, &served, r == Repr::Metadata);
    }
    out.extend_from_slice(b"]}");
    respond(200, "application/json", out)
}

/// One stored object as a list item or a watch event's object, in `api_version` (the version the
/// request was served in), whole or (`metadata`) as its `PartialObjectMetadata`.
fn write_entry(out: &mut Vec<u8>, entry: &Entry, api_version: &str, metadata: bool) {
    if metadata {
        match entry.text_metadata() {
            Some(meta) => write_partial_from(out, meta),
            None => write_partial_metadata(out, &entry.object(), None),
        }
        return;
    }
    if let Some(json) = entry.text_in(api_version) {
        out.extend_from_slice(json);
        return;
    }
    let obj = entry.object();
    if obj.get("apiVersion").and_then(Value::as_str) == Some(api_version) {
        let _ = serde_json::to_writer(out, &*obj);
    } else {
        let mut o = (*obj).clone();
        o["apiVersion"] = json!(api_version);
        let _ = serde_json::to_writer(out, &o);
    }
}

/// The patch kind a PATCH request's content type names; another type is 415 with the four accepted.
fn patch_kind(headers: &HeaderMap) -> Result<PatchKind, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    PatchKind::from_content_type(ct).ok_or_else(|| {
        ApiError::unsupported_media_type(
            ct,
            &[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
                "application/strategic-merge-patch+json",
            ],
        )
    })
}

/// The answer to a DELETE: the object while finalizers or a grace period keep it, else a Success
/// Status naming it.
fn deleted_response(t: &ResourceType, d: Deleted) -> Response {
    match d {
        Deleted::Pending(o) => written(200, &o, None, Repr::Json),
        Deleted::Gone(o) => json_response(
            200,
            &json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name_of(&o), "group": t.group, "kind": t.plural, "uid": o.at("/metadata/uid")}
            }),
        ),
    }
}

/// `DELETE` on a collection: the objects it deleted, as a JSON list.
fn delete_collection(
    shared: &Shared,
    id: ResId,
    t: &ResourceType,
    p: &ResourcePath,
    params: &Params,
    body: &[u8],
) -> Result<Response, ApiError> {
    let list = params.list_options(t)?;
    let opts = delete_options(params, body)?;
    let (items, rv) = shared.with(|c| {
        c.core
            .delete_collection(id, p.namespace.as_deref(), &list, &opts)
            .map(|i| (i, c.core.store.resource_version()))
    })?;
    let page = ListPage {
        items,
        resource_version: rv,
        continue_token: None,
    };
    // A JSON list needs no clock (only tables print ages).
    Ok(list_response(
        t,
        &page,
        Repr::Json,
        jiff::Timestamp::UNIX_EPOCH,
        "Object",
    ))
}

// ----- evictions -----

/// `POST .../pods/{name}/eviction`, as `kubectl drain` evicts: the pod is marked `DisruptionTarget`
/// (reason `EvictionByEvictionAPI`) and deleted gracefully. (No PodDisruptionBudgets are modelled.)
fn evict(shared: &Arc<Shared>, id: ResId, ns: &str, name: &str) -> Result<Response, ApiError> {
    shared.with(|c| {
        let pod = c.core.get(id, ns, name)?;
        let key = c.core.key_of(id, ns, name);
        let now = super::clock::format_time(c.core.now);
        c.core.update_internal(&key, |p| {
            super::volcano::disruption(p, "EvictionByEvictionAPI", "Eviction API: evicting", &now);
        });
        c.core.delete(id, ns, name, &DeleteOptions::default())?;
        Ok(json_response(
            201,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "kind": "pods", "uid": pod.at("/metadata/uid")}}),
        ))
    })
}

// ----- pod logs -----

/// What a `GET .../pods/{name}/log` asks for.
#[derive(Clone)]
struct LogRequest {
    namespace: String,
    name: String,
    container: Option<String>,
    timestamps: bool,
    /// The first instant shown, fixed when the request arrives so that a followed log only grows.
    since: Option<Timestamp>,
    default_run: Duration,
}

/// Where a log starts: `sinceSeconds` counts back from the server's clock when the log is read (the
/// simulated clock, which may run ahead of the caller's), `sinceTime` is an instant.
#[derive(Clone, Copy)]
enum Since {
    Start,
    SecondsAgo(i64),
    Time(Timestamp),
}

impl Since {
    fn parse(params: &Params) -> Result<Self, ApiError> {
        match (params.get("sinceSeconds"), params.get("sinceTime")) {
            (Some(_), Some(_)) => Err(ApiError::bad_request(
                "at most one of sinceTime or sinceSeconds may be specified".to_string(),
            )),
            (Some(s), None) => match s.parse::<i64>() {
                Ok(n) if n > 0 => Ok(Self::SecondsAgo(n)),
                _ => Err(ApiError::bad_request(format!(
                    "sinceSeconds: Invalid value: {s:?}: must be greater than 0"
                ))),
            },
            (None, Some(t)) => t.parse::<Timestamp>().map(Self::Time).map_err(|_| {
                ApiError::bad_request(format!(
                    "sinceTime: Invalid value: {t:?}: not an RFC 3339 time"
                ))
            }),
            (None, None) => Ok(Self::Start),
        }
    }

    /// The first instant shown when the log is read at `now`; a `sinceSeconds` that reaches back past
    /// the earliest instant there is (year -9999) is a 400, never an overflow.
    fn at(self, now: Timestamp) -> Result<Option<Timestamp>, ApiError> {
        match self {
            Self::Start => Ok(None),
            Self::SecondsAgo(n) => now
                .checked_sub(SignedDuration::from_secs(n))
                .map(Some)
                .map_err(|_| {
                    ApiError::bad_request(format!(
                        "sinceSeconds: Invalid value: {n}: reaches back before the earliest time there is"
                    ))
                }),
            Self::Time(t) => Ok(Some(t)),
        }
    }
}

/// `tailLines` and `limitBytes` of a log request, checked as the API server checks them: integers,
/// `tailLines` at least 0, `limitBytes` at least 1.
#[derive(Clone, Copy, Default)]
struct LogLimits {
    /// Only the last this many lines.
    tail_lines: Option<usize>,
    /// At most this many bytes in all (a followed log ends there).
    limit_bytes: Option<usize>,
}

impl LogLimits {
    fn parse(params: &Params) -> Result<Self, ApiError> {
        let number = |key: &str, min: i64, what: &str| -> Result<Option<usize>, ApiError> {
            let Some(raw) = params.get(key) else {
                return Ok(None);
            };
            match raw.parse::<i64>() {
                // Beyond the address space is as good as no limit.
                Ok(n) if n >= min => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
                Ok(n) => Err(ApiError::bad_request(format!(
                    "{key}: Invalid value: {n}: must be {what}"
                ))),
                Err(_) => Err(ApiError::bad_request(format!(
                    "{key}: Invalid value: {raw:?}: not an integer"
                ))),
            }
        };
        Ok(Self {
            tail_lines: number("tailLines", 0, "greater than or equal to 0")?,
            limit_bytes: number("limitBytes", 1, "greater than 0")?,
        })
    }

    /// The last `tail_lines` lines of `text`.
    fn tail(&self, text: &str) -> String {
        match self.tail_lines {
            Some(n) => {
                let lines: Vec<&str> = text.lines().collect();
                let skip = lines.len().saturating_sub(n);
                lines[skip..].iter().map(|l| format!("{l}\n")).collect()
            }
            None => text.to_owned(),
        }
    }
}

/// `chunk` cut to what is left of the byte limit (`None`: no limit), and the limit left after it.
fn within_limit(mut chunk: Vec<u8>, left: Option<usize>) -> (Vec<u8>, Option<usize>) {
    match left {
        Some(left) => {
            chunk.truncate(left);
            let sent = chunk.len();
            (chunk, Some(left - sent))
        }
        None => (chunk, None),
    }
}

impl LogRequest {
    /// The log so far, and whether the container has finished (no more lines will come).
    fn render(&self, c: &Cluster) -> Result<(String, bool), ApiError> {
        let pod = c.core.get(c.core.ids.pods, &self.namespace, &self.name)?;
        let text = super::volcano::kubelet_log(
            &pod,
            self.container.as_deref(),
            self.default_run,
            c.core.now,
            self.timestamps,
            self.since,
        )?;
        let container = self.container.clone().or_else(|| {
            pod.at("/spec/containers/0/name")
                .and_then(Value::as_str)
                .map(String::from)
        });
        let done = pod
            .at("/status/containerStatuses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|s| s["name"].as_str() == container.as_deref())
            .is_none_or(|s| s.at("/state/terminated").is_some());
        Ok((text, done))
    }
}

fn pod_log(
    shared: &Arc<Shared>,
    p: &ResourcePath,
    ns: &str,
    params: &Params,
) -> Result<Response, ApiError> {
    let since = Since::parse(params)?;
    let limits = LogLimits::parse(params)?;
    let mut req = LogRequest {
        namespace: ns.to_string(),
        name: p.name.clone().unwrap_or_default(),
        container: params.get("container").map(String::from),
        timestamps: params.flag("timestamps"),
        since: None,
        default_run: shared.settings.default_run,
    };
    let (text, done) = shared.with(|c| {
        req.since = since.at(c.core.now)?;
        req.render(c)
    })?;
    let (first, left) = within_limit(limits.tail(&text).into_bytes(), limits.limit_bytes);
    if !params.flag("follow") || done || left == Some(0) {
        return Ok(respond(200, "text/plain", first));
    }
    let mut rx = shared.subscribe();
    rx.mark_unchanged();
    let state = (
        shared.clone(),
        req,
        rx,
        Some(first),
        text.len(),
        false,
        left,
    );
    let stream = futures::stream::unfold(
        state,
        |(shared, req, mut rx, pending, mut sent, finished, left)| async move {
            if let Some(p) = pending {
                return Some((
                    Ok::<Bytes, std::io::Error>(Bytes::from(p)),
                    (shared, req, rx, None, sent, finished, left),
                ));
            }
            if finished || left == Some(0) {
                return None;
            }
            loop {
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return None,
                    r = rx.changed() => if r.is_err() { return None },
                }
                let Ok((text, done)) = shared.read(|c| req.render(c)) else {
                    return None;
                };
                if text.len() > sent || done {
                    let chunk = text.get(sent..).unwrap_or_default().as_bytes().to_vec();
                    let (chunk, left) = within_limit(chunk, left);
                    sent = text.len();
                    return Some((
                        Ok(Bytes::from(chunk)),
                        (shared, req, rx, None, sent, done, left),
                    ));
                }
            }
        },
    );
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty())))
}

// ----- watch -----

/// An instant no watch lives to see: about 30 years from `now`.
fn far_future(now: tokio::time::Instant) -> tokio::time::Instant {
    now.checked_add(Duration::from_secs(30 * 365 * 86_400))
        .unwrap_or(now)
}

struct WatchSpec {
    storage: ResId,
    kind: String,
    api_version: String,
    namespace: Option<String>,
    label: LabelSelector,
    field: FieldSelector,
    bookmarks: bool,
    repr: Repr,
}

impl WatchSpec {
    /// The event type a history record becomes for this watch, if any.
    fn event(&self, r: &Change) -> Option<&'static str> {
        let key = r.key();
        if key.res != self.storage {
            return None;
        }
        if let Some(ns) = &self.namespace
            && &key.namespace != ns
        {
            return None;
        }
        let now = r.matches_now(&self.label, &self.field);
        let before = r.matched_before(&self.label, &self.field);
        match r.kind() {
            EventType::Added if now => Some("ADDED"),
            EventType::Modified if now && before => Some("MODIFIED"),
            EventType::Modified if now => Some("ADDED"),
            EventType::Modified if before => Some("DELETED"),
            EventType::Deleted if now || before => Some("DELETED"),
            _ => None,
        }
    }

    /// A history record as an event of this watch: its encoding is shared with every other watch
    /// that sends it in the same form.
    ///
    /// An object that a change took out of this watch's selection is a `DELETED` event carrying the
    /// object as it was before the change, at the change's version, as Kubernetes' watch cache sends it
    /// (a client never sees the content that no longer matches).
    fn encode_record(&self, ty: &str, r: &Change) -> Bytes {
        if ty == "DELETED"
            && r.kind() == EventType::Modified
            && let Some(line) = r.with_before(|prev, rv| self.encode_at(ty, prev, rv))
        {
            return line;
        }
        match self.repr {
            Repr::Metadata => r.event_line(ty, true),
            _ if r.in_version(&self.api_version) => r.event_line(ty, false),
            _ => self.encode(ty, &r.sent_object()),
        }
    }

    /// [`WatchSpec::encode`] of `obj` at version `rv`, written so rather than copied and stamped.
    fn encode_at(&self, ty: &str, obj: &Value, rv: &str) -> Bytes {
        match self.repr {
            Repr::Metadata => watch_line(ty, 512, |out| write_partial_metadata(out, obj, Some(rv))),
            _ if obj.get("apiVersion").and_then(Value::as_str)
                == Some(self.api_version.as_str()) =>
            {
                watch_line(ty, 4096, |out| {
                    write_object(out, obj, Some(rv));
                })
            }
            _ => self.encode(ty, &stamped(obj, rv)),
        }
    }

    fn encode(&self, ty: &str, obj: &Value) -> Bytes {
        watch_line(ty, 1024, |out| match self.repr {
            Repr::Metadata => write_partial_metadata(out, obj, None),
            _ if obj.get("apiVersion").and_then(Value::as_str)
                == Some(self.api_version.as_str()) =>
            {
                let _ = serde_json::to_writer(out, obj);
            }
            _ => {
                let mut o = obj.clone();
                o["apiVersion"] = json!(self.api_version);
                let _ = serde_json::to_writer(out, &o);
            }
        })
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let (kind, api_version) = match self.repr {
            Repr::Metadata => (
                "PartialObjectMetadata".to_string(),
                "meta.k8s.io/v1".to_string(),
            ),
            _ => (self.kind.clone(), self.api_version.clone()),
        };
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
        watch_line("BOOKMARK", 256, |out| {
            let _ = serde_json::to_writer(out, &obj);
        })
    }
}

fn gone_event(e: &ApiError) -> Bytes {
    watch_line("ERROR", 256, |out| {
        let _ = serde_json::to_writer(out, &e.to_status());
    })
}

struct WatchState {
    shared: Arc<Shared>,
    spec: WatchSpec,
    pos: u64,
    pending: VecDeque<(Bytes, bool)>,
    rx: watch::Receiver<u64>,
    cuts: watch::Receiver<u64>,
    deadline: tokio::time::Instant,
    cut_after_events: Option<u64>,
    cut_at: Option<tokio::time::Instant>,
    /// Fraction of events silently dropped, and how much of an event is owed to it so far.
    lose: f64,
    lost: f64,
    sent: u64,
    done: bool,
    bookmark_every: Duration,
}

const WATCH_BATCH: usize = 2000;

/// A cut watch first lets the server flush what it already sent (hyper drops buffered bytes when a
/// body fails), so that the client sees the events before the connection drops.
const FLUSH_BEFORE_CUT: Duration = Duration::from_millis(20);

impl WatchState {
    /// Moves history after `pos` into `pending`.
    fn pull(&mut self) {
        let spec = &self.spec;
        let (batch, current) = self.shared.read(|c| {
            (
                c.core
                    .store
                    .history_after(spec.storage, self.pos, WATCH_BATCH),
                c.core.store.resource_version(),
            )
        });
        match batch {
            None => {
                let e = ApiError::expired(format!(
                    "too old resource version: {} ({})",
                    self.pos, current
                ));
                self.pending.push_back((gone_event(&e), false));
                self.done = true;
            }
            Some(records) => {
                let full = records.len() == WATCH_BATCH;
                for r in &records {
                    if let Some(ty) = spec.event(r) {
                        self.pending.push_back((spec.encode_record(ty, r), true));
                    }
                    self.pos = r.rv();
                }
                if !full {
                    self.pos = self.pos.max(current);
                }
            }
        }
    }
}

/// Chunks of a watch's response waiting to be sent, each marked whether it is an event (the fault plan
/// counts and drops events, never bookmarks or errors).
type Pending = VecDeque<(Bytes, bool)>;

/// Answers a watch: the initial events (a list, or "gone" for a version too old), then the history
/// as it grows, bookmarks, and the faults the plan asks for, until the timeout.
fn start_watch(
    shared: &Arc<Shared>,
    id: ResId,
    t: &ResourceType,
    namespace: Option<String>,
    params: &Params,
    repr: Repr,
    decision: &super::faults::Decision,
) -> Result<Response, ApiError> {
    let opts = params.list_options(t)?;
    let timeout = watch_timeout(shared, params)?;
    let spec = WatchSpec {
        storage: t.storage,
        kind: t.kind.clone(),
        api_version: t.api_version(),
        namespace: namespace.clone(),
        label: opts.label.clone(),
        field: opts.field.clone(),
        bookmarks: params.flag("allowWatchBookmarks"),
        repr: if repr == Repr::Metadata {
            Repr::Metadata
        } else {
            Repr::Json
        },
    };
    let (pos, pending, done) = watch_start(shared, id, t, params, &opts, &spec)?;
    let now = tokio::time::Instant::now();
    let mut rx = shared.subscribe_res(t.storage);
    rx.mark_unchanged();
    let mut cuts = shared.cuts.subscribe();
    cuts.mark_unchanged();
    let state = WatchState {
        shared: shared.clone(),
        spec,
        pos,
        pending,
        rx,
        cuts,
        // A timeout past what a clock can hold (`timeoutSeconds` near 2^63) is no timeout.
        deadline: now.checked_add(timeout).unwrap_or_else(|| far_future(now)),
        cut_after_events: decision.cut_after_events,
        cut_at: decision
            .cut_after
            .map(|d| now.checked_add(d).unwrap_or_else(|| far_future(now))),
        lose: decision.lose_events,
        lost: 0.0,
        sent: 0,
        done,
        bookmark_every: shared.settings.bookmark_interval,
    };
    let stream = futures::stream::unfold(state, WatchState::next_chunk);
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty())))
}

/// `timeoutSeconds` as the API server reads it: an integer, 0 or less for the server's own timeout.
fn watch_timeout(shared: &Shared, params: &Params) -> Result<Duration, ApiError> {
    Ok(match params.get("timeoutSeconds") {
        None => shared.settings.watch_timeout,
        Some(raw) => match raw.parse::<i64>() {
            Ok(n) if n > 0 => Duration::from_secs(n.unsigned_abs()),
            Ok(_) => shared.settings.watch_timeout,
            Err(_) => {
                return Err(ApiError::bad_request(format!(
                    "timeoutSeconds: Invalid value: {raw:?}: not an integer"
                )));
            }
        },
    })
}

/// Where a watch starts: from a list (no version, "0", or `sendInitialEvents`: every object as ADDED, then
/// the initial-events-end bookmark when asked for), else from the version given, with a "gone" event when
/// the history no longer reaches back to it. Returns the version, the first events and whether that is all.
fn watch_start(
    shared: &Arc<Shared>,
    id: ResId,
    t: &ResourceType,
    params: &Params,
    opts: &ListOptions,
    spec: &WatchSpec,
) -> Result<(u64, Pending, bool), ApiError> {
    let send_initial = params.flag("sendInitialEvents");
    let rv_param = params.get("resourceVersion").unwrap_or_default();
    let mut pending = VecDeque::new();
    if rv_param.is_empty() || rv_param == "0" || send_initial {
        let page = shared.with(|c| {
            c.core.list_entries(
                id,
                spec.namespace.as_deref(),
                &ListOptions {
                    limit: None,
                    continue_token: None,
                    ..opts.clone()
                },
            )
        })?;
        let metadata = spec.repr == Repr::Metadata;
        for entry in &page.entries {
            let line = watch_line("ADDED", 1024, |out| {
                write_entry(out, entry, &spec.api_version, metadata)
            });
            pending.push_back((line, true));
        }
        if send_initial && spec.bookmarks {
            pending.push_back((spec.bookmark(page.resource_version, true), false));
        }
        return Ok((page.resource_version, pending, false));
    }
    let rv: u64 = rv_param
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv_param:?}")))?;
    let oldest = shared.read(|c| c.core.store.watchable_from(t.storage));
    let mut done = false;
    if rv < oldest {
        let e = ApiError::expired(format!("too old resource version: {rv} ({})", oldest + 1));
        pending.push_back((gone_event(&e), false));
        done = true;
    }
    Ok((rv, pending, done))
}

impl WatchState {
    /// The watch's next chunk of the response body: a pending event (unless the fault plan drops it
    /// or cuts the watch there), else what the history gained; waits for a change, a cut, the next
    /// bookmark or the timeout. `None` ends the response.
    async fn next_chunk(mut self) -> Option<(Result<Bytes, std::io::Error>, Self)> {
        loop {
            if let Some((bytes, is_event)) = self.pending.pop_front() {
                if is_event {
                    if self.cut_after_events.is_some_and(|n| self.sent >= n) {
                        self.done = true;
                        self.pending.clear();
                        self.cut_after_events = None;
                        tokio::time::sleep(FLUSH_BEFORE_CUT).await;
                        return Some((
                            Err(std::io::Error::other("watch cut by the fault plan")),
                            self,
                        ));
                    }
                    self.lost += self.lose;
                    if self.lost >= 1.0 {
                        self.lost -= 1.0;
                        continue;
                    }
                    self.sent += 1;
                }
                return Some((Ok::<Bytes, std::io::Error>(bytes), self));
            }
            if self.done {
                return None;
            }
            self.pull();
            if !self.pending.is_empty() {
                continue;
            }
            let cut_at = self.cut_at;
            let bookmark = self.spec.bookmarks;
            tokio::select! {
                _ = self.shared.shutdown.cancelled() => return None,
                _ = tokio::time::sleep_until(self.deadline) => return None,
                _ = async { match cut_at { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                    self.done = true;
                    tokio::time::sleep(FLUSH_BEFORE_CUT).await;
                    return Some((Err(std::io::Error::other("watch cut by the fault plan")), self));
                }
                r = self.rx.changed() => if r.is_err() { return None },
                _ = self.cuts.changed() => {
                    self.done = true;
                    tokio::time::sleep(FLUSH_BEFORE_CUT).await;
                    return Some((Err(std::io::Error::other("watch cut")), self));
                }
                _ = tokio::time::sleep(self.bookmark_every), if bookmark => {
                    // Caught up first (a quiet kind's watch is not woken by other kinds' changes), so
                    // the bookmark names the current version, after any event of its own kind.
                    self.pull();
                    if !self.done {
                        let rv = self.pos;
                        self.pending.push_back((self.spec.bookmark(rv, false), false));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::api::{Core, WriteOptions};

    fn body(r: Response) -> Vec<u8> {
        futures::executor::block_on(axum::body::to_bytes(r.into_body(), usize::MAX))
            .unwrap()
            .to_vec()
    }

    /// A list sends an object kept as text as that text (and its metadata cut from it), byte for
    /// byte what writing the tree gave, for whole objects and metadata, on every page.
    #[test]
    fn a_list_sends_kept_objects_as_their_text_exactly_as_it_wrote_their_trees() {
        let mut c = Core::new(1000, 7, "2026-01-01T00:00:00Z".parse().unwrap());
        let cms = c.ids.configmaps;
        for name in ["a", "b", "c"] {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": name, "labels": {"app": name}},
                            "data": {"text": "quote \" and \u{e9}"}});
            let w = c
                .create(cms, "default", cm, &WriteOptions::default())
                .unwrap();
            c.record_event(&w.object, "Normal", "Made", &format!("made {name}"), "test");
        }
        let events = c.ids.events;
        let page = c
            .list_entries(events, Some("default"), &ListOptions::default())
            .unwrap();
        assert_eq!(page.entries.len(), 3);
        assert!(
            page.entries
                .iter()
                .all(|e| e.text_in(&c.registry.get(events).api_version()).is_some()),
            "Events are kept as text"
        );
        let now = c.now;
        for res in [events, cms] {
            let t = c.registry.get(res);
            for repr in [Repr::Json, Repr::Metadata] {
                for limit in [None, Some(2)] {
                    let mut opts = ListOptions {
                        limit,
                        ..ListOptions::default()
                    };
                    loop {
                        let entries = c.list_entries(res, None, &opts).unwrap();
                        let trees = c.list(res, None, &opts).unwrap();
                        let text = body(entries_response(&t, &entries, repr));
                        let written = body(list_response(&t, &trees, repr, now, "Metadata"));
                        assert_eq!(
                            String::from_utf8(text).unwrap(),
                            String::from_utf8(written).unwrap(),
                            "{} {repr:?} {limit:?}",
                            t.plural
                        );
                        match entries.continue_token {
                            Some(token) => opts.continue_token = Some(token),
                            None => break,
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn routes() {
        let Some(Route::Resource(p)) =
            parse_route("/apis/batch.volcano.sh/v1alpha1/namespaces/ns/jobs/j-1/status")
        else {
            panic!()
        };
        assert_eq!(
            (
                p.group.as_str(),
                p.namespace.as_deref(),
                p.plural.as_str(),
                p.name.as_deref(),
                p.sub.as_deref()
            ),
            (
                "batch.volcano.sh",
                Some("ns"),
                "jobs",
                Some("j-1"),
                Some("status")
            )
        );
        let Some(Route::Resource(p)) = parse_route("/api/v1/namespaces/foo") else {
            panic!()
        };
        assert_eq!(
            (p.plural.as_str(), p.name.as_deref(), p.namespace),
            ("namespaces", Some("foo"), None)
        );
        let Some(Route::Resource(p)) = parse_route("/api/v1/namespaces/foo/status") else {
            panic!()
        };
        assert_eq!(
            (p.plural.as_str(), p.name.as_deref(), p.sub.as_deref()),
            ("namespaces", Some("foo"), Some("status"))
        );
        let Some(Route::Resource(p)) = parse_route("/api/v1/namespaces/foo/pods") else {
            panic!()
        };
        assert_eq!(
            (p.plural.as_str(), p.namespace.as_deref(), p.name),
            ("pods", Some("foo"), None)
        );
        let Some(Route::Resource(p)) = parse_route("/api/v1/pods") else {
            panic!()
        };
        assert_eq!((p.plural.as_str(), p.namespace), ("pods", None));
        assert!(matches!(
            parse_route("/apis/batch.volcano.sh/v1alpha1"),
            Some(Route::GroupVersion(..))
        ));
        assert!(parse_route("/nope").is_none());
    }
}
