//! Every Kubernetes API request, seen from the client side: [`KubeCallLayer`] wraps the kube client's
//! HTTP stack, turns each request into an [`ApiCall`] (the RBAC verb and resource, as the API server's
//! authorizer sees it), times it, and reports it to [`Metrics`] and, when asked, to a [`CallRecorder`].
//!
//! The recorder is what the RBAC test runs the runner with: every (verb, resource, namespace) the runner
//! really calls is checked against the Role and ClusterRole in `deploy/`.
//!
//! The verb follows the API server's request-info rules: `GET` of a named object is `get`, of a collection
//! `list`, or `watch` with `?watch=true`; `POST` is `create`, `PUT` `update`, `PATCH` `patch`; `DELETE` of a
//! named object is `delete`, of a collection `deletecollection`. Discovery (`/api`, `/apis`, `/version`)
//! is a non-resource request, allowed to every authenticated client by the default
//! `system:discovery` role.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use http::{Method, Request, Response, Uri};

use super::Metrics;

/// One API request as the authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiCall {
    /// A request for a resource (most requests).
    Resource(ResourceCall),
    /// Discovery and other paths that name no resource.
    NonResource { verb: &'static str, path: String },
}

/// A resource request: verb, API group, resource, subresource, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceCall {
    pub verb: &'static str,
    /// `""` for the core group.
    pub group: String,
    /// The plural resource, e.g. `jobs`, `pods`, `leases`.
    pub resource: String,
    pub subresource: Option<String>,
    /// `None` for a cluster-scoped resource or a request across all namespaces.
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl ResourceCall {
    /// The resource as RBAC rules write it: `jobs`, `jobs/status`.
    pub fn rbac_resource(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }

    /// The metric label: `jobs.batch.volcano.sh`, `pods`, `jobs.batch.volcano.sh/status`.
    pub fn metric_resource(&self) -> String {
        let mut out = self.resource.clone();
        if !self.group.is_empty() {
            out.push('.');
            out.push_str(&self.group);
        }
        if let Some(sub) = &self.subresource {
            out.push('/');
            out.push_str(sub);
        }
        out
    }
}

impl fmt::Display for ApiCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiCall::Resource(r) => {
                write!(f, "{} {}", r.verb, r.metric_resource())?;
                match &r.namespace {
                    Some(ns) => write!(f, " in {ns}"),
                    None => Ok(()),
                }
            }
            ApiCall::NonResource { verb, path } => write!(f, "{verb} {path}"),
        }
    }
}

impl ApiCall {
    /// Classifies a request by method and URI (the path relative to the API server).
    pub fn from_request(method: &Method, uri: &Uri) -> Self {
        let path = uri.path();
        let watch = uri.query().is_some_and(|q| {
            q.split('&')
                .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"))
        });
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (group, rest) = match segments.as_slice() {
            ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
            ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
            _ => {
                return ApiCall::NonResource {
                    verb: non_resource_verb(method),
                    path: path.to_owned(),
                };
            }
        };
        let (namespace, rest) = match rest {
            // `namespaces/{ns}/{resource}...`, but not `namespaces/{name}[/status|/finalize]`, which is the
            // Namespace object itself.
            ["namespaces", ns, resource, tail @ ..]
                if !(tail.is_empty() && matches!(*resource, "status" | "finalize")) =>
            {
                (Some((*ns).to_owned()), {
                    let mut v = vec![*resource];
                    v.extend_from_slice(tail);
                    v
                })
            }
            other => (None, other.to_vec()),
        };
        let resource = rest[0].to_owned();
        let name = rest.get(1).map(|s| (*s).to_owned());
        let subresource = rest.get(2).map(|s| (*s).to_owned());
        let verb = match *method {
            Method::GET | Method::HEAD if watch => "watch",
            Method::GET | Method::HEAD if name.is_some() => "get",
            Method::GET | Method::HEAD => "list",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if name.is_some() => "delete",
            Method::DELETE => "deletecollection",
            _ => "unknown",
        };
        ApiCall::Resource(ResourceCall {
            verb,
            group: group.to_owned(),
            resource,
            subresource,
            namespace,
            name,
        })
    }

    fn verb(&self) -> &'static str {
        match self {
            ApiCall::Resource(r) => r.verb,
            ApiCall::NonResource { verb, .. } => verb,
        }
    }

    fn metric_resource(&self) -> String {
        match self {
            ApiCall::Resource(r) => r.metric_resource(),
            ApiCall::NonResource { .. } => "nonresource".to_owned(),
        }
    }
}

fn non_resource_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "unknown",
    }
}

/// A fixed word for a failed response's status (the `error` label), `None` for success.
pub fn error_class(status: Option<u16>) -> Option<&'static str> {
    match status {
        None => Some("transport"),
        Some(s) if s < 400 => None,
        Some(401) => Some("unauthorized"),
        Some(403) => Some("forbidden"),
        Some(404) => Some("not_found"),
        Some(409) => Some("conflict"),
        Some(410) => Some("gone"),
        Some(422) => Some("invalid"),
        Some(429) => Some("throttled"),
        Some(s) if s >= 500 => Some("server_error"),
        Some(_) => Some("client_error"),
    }
}

/// A recorded request and its response status (`None`: no response, a transport error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    pub call: ApiCall,
    pub status: Option<u16>,
}

/// Keeps every request made through a client built with it. Cheap to clone; clones share the record.
#[derive(Debug, Clone, Default)]
pub struct CallRecorder {
    calls: Arc<Mutex<Vec<RecordedCall>>>,
}

impl CallRecorder {
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&self, call: RecordedCall) {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call);
    }

    /// Everything recorded so far, in order.
    pub fn calls(&self) -> Vec<RecordedCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The tower layer that observes every request of a kube client. Install it with
/// [`cluster::client::connect_with`](crate::cluster::client::connect_with).
#[derive(Debug, Clone, Default)]
pub struct KubeCallLayer {
    metrics: Option<Metrics>,
    recorder: Option<CallRecorder>,
}

impl KubeCallLayer {
    /// Observes nothing (the client behaves as without it).
    pub fn new() -> Self {
        Self::default()
    }

    /// Reports every request to `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Records every request in `recorder`.
    pub fn with_recorder(mut self, recorder: CallRecorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    fn observe(&self, call: ApiCall, elapsed: Duration, status: Option<u16>) {
        if let Some(metrics) = &self.metrics {
            metrics.kube_call(
                call.verb(),
                &call.metric_resource(),
                elapsed,
                error_class(status),
            );
        }
        if let Some(recorder) = &self.recorder {
            recorder.push(RecordedCall { call, status });
        }
    }
}

impl<S> tower::Layer<S> for KubeCallLayer {
    type Service = KubeCallService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        KubeCallService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`KubeCallLayer`] wraps around the client's stack.
#[derive(Debug, Clone)]
pub struct KubeCallService<S> {
    inner: S,
    layer: KubeCallLayer,
}

impl<S, B, RB> tower::Service<Request<B>> for KubeCallService<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let call = ApiCall::from_request(request.method(), request.uri());
        let started = Instant::now();
        let response = self.inner.call(request);
        let layer = self.layer.clone();
        Box::pin(async move {
            let result = response.await;
            let status = result.as_ref().ok().map(|r| r.status().as_u16());
            layer.observe(call, started.elapsed(), status);
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(method: Method, uri: &str) -> ApiCall {
        ApiCall::from_request(&method, &uri.parse().unwrap())
    }

    fn resource(method: Method, uri: &str) -> ResourceCall {
        match call(method, uri) {
            ApiCall::Resource(r) => r,
            other => panic!("{uri}: {other:?}"),
        }
    }

    #[test]
    fn verbs_follow_the_request_info_rules() {
        let cases = [
            (Method::GET, "/api/v1/namespaces/a/pods/p", "get"),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods?labelSelector=x",
                "list",
            ),
            (Method::GET, "/api/v1/pods", "list"),
            (
                Method::GET,
                "/apis/batch.volcano.sh/v1alpha1/jobs?watch=true&resourceVersion=5",
                "watch",
            ),
            (Method::POST, "/api/v1/namespaces/a/configmaps", "create"),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/r/leases/l",
                "update",
            ),
            (Method::PATCH, "/api/v1/namespaces/a/configmaps/c", "patch"),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/configmaps/c",
                "delete",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/configmaps",
                "deletecollection",
            ),
        ];
        for (method, uri, verb) in cases {
            assert_eq!(resource(method, uri).verb, verb, "{uri}");
        }
    }

    #[test]
    fn resources_groups_namespaces_and_subresources() {
        let r = resource(
            Method::PATCH,
            "/apis/batch.volcano.sh/v1alpha1/namespaces/u-1/jobs/j-42/status",
        );
        assert_eq!(
            (
                r.group.as_str(),
                r.resource.as_str(),
                r.namespace.as_deref(),
                r.name.as_deref()
            ),
            ("batch.volcano.sh", "jobs", Some("u-1"), Some("j-42"))
        );
        assert_eq!(r.rbac_resource(), "jobs/status");
        assert_eq!(r.metric_resource(), "jobs.batch.volcano.sh/status");

        let ns = resource(Method::GET, "/api/v1/namespaces/u-1");
        assert_eq!((ns.resource.as_str(), ns.namespace), ("namespaces", None));
        assert_eq!(ns.name.as_deref(), Some("u-1"));
        let ns_status = resource(Method::PUT, "/api/v1/namespaces/u-1/status");
        assert_eq!(ns_status.rbac_resource(), "namespaces/status");
        assert_eq!(ns_status.namespace, None);
        let created = resource(Method::POST, "/api/v1/namespaces");
        assert_eq!(
            (created.verb, created.resource.as_str()),
            ("create", "namespaces")
        );
        let queue = resource(
            Method::GET,
            "/apis/scheduling.volcano.sh/v1beta1/queues/default",
        );
        assert_eq!(queue.metric_resource(), "queues.scheduling.volcano.sh");
        assert_eq!(queue.namespace, None);
        let logs = resource(Method::GET, "/api/v1/namespaces/a/pods/p/log?container=c");
        assert_eq!(
            (logs.verb, logs.rbac_resource().as_str()),
            ("get", "pods/log")
        );
    }

    #[test]
    fn discovery_is_non_resource() {
        for path in [
            "/version",
            "/api",
            "/api/v1",
            "/apis",
            "/apis/batch.volcano.sh/v1alpha1",
        ] {
            assert!(
                matches!(
                    call(Method::GET, path),
                    ApiCall::NonResource { verb: "get", .. }
                ),
                "{path}"
            );
        }
    }

    #[test]
    fn error_classes() {
        assert_eq!(error_class(Some(200)), None);
        assert_eq!(error_class(Some(201)), None);
        assert_eq!(error_class(Some(404)), Some("not_found"));
        assert_eq!(error_class(Some(409)), Some("conflict"));
        assert_eq!(error_class(Some(503)), Some("server_error"));
        assert_eq!(error_class(Some(418)), Some("client_error"));
        assert_eq!(error_class(None), Some("transport"));
    }

    /// Answers 404 to DELETE and 200 to everything else.
    struct Answer;

    impl tower::Service<Request<()>> for Answer {
        type Response = Response<()>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<()>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<()>) -> Self::Future {
            let status = if req.method() == Method::DELETE {
                404
            } else {
                200
            };
            std::future::ready(Ok(Response::builder().status(status).body(()).unwrap()))
        }
    }

    #[tokio::test]
    async fn the_layer_times_and_records_requests() {
        use tower::{Layer, Service};

        let recorder = CallRecorder::new();
        let metrics = Metrics::new();
        let layer = KubeCallLayer::new()
            .with_metrics(metrics.clone())
            .with_recorder(recorder.clone());
        let mut service = layer.layer(Answer);
        let get = Request::get("/api/v1/namespaces/a/pods/p")
            .body(())
            .unwrap();
        service.call(get).await.unwrap();
        let delete = Request::delete("/api/v1/namespaces/a/pods/p")
            .body(())
            .unwrap();
        service.call(delete).await.unwrap();
        let calls = recorder.calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].status, Some(404));
        assert_eq!(calls[1].call.to_string(), "delete pods in a");
        let s = super::super::metrics::Samples::parse(&metrics.encode()).unwrap();
        assert_eq!(
            s.get(
                "volcano_runner_kube_request_errors_total",
                &[
                    ("verb", "delete"),
                    ("resource", "pods"),
                    ("error", "not_found")
                ]
            ),
            Some(1.0)
        );
        assert_eq!(
            s.get(
                "volcano_runner_kube_requests_total",
                &[("verb", "get"), ("resource", "pods")]
            ),
            Some(1.0)
        );
    }
}
