//! Helpers of the ops tests: rendering the Kustomize directories in deploy/, reading the rendered objects
//! into their Kubernetes types, and the configuration a rendered Deployment starts the runner with.
#![allow(dead_code)]

#[path = "../common/rabbit.rs"]
pub mod rabbit;

pub mod capture;
pub mod fleet;
pub mod secrets;

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use volcano_runner::config::Config;

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// deploy/ of the repository.
pub fn deploy() -> PathBuf {
    root().join("deploy")
}

/// The objects a Kustomize directory (relative to deploy/) renders to, rendered by `kubectl kustomize` as an
/// operator renders them. kubectl is required, not optional: `scripts/test` installs it when it is missing
/// (Debian's `kubernetes-client`), so these checks run on every machine instead of being skipped.
pub fn render(dir: &str) -> Vec<Value> {
    let path = deploy().join(dir);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "kubectl cannot be run ({e}): the deploy tests need it; scripts/test installs it \
                 (apt-get install kubernetes-client)"
            )
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_docs(&String::from_utf8(out.stdout).unwrap(), &path)
}

/// Every YAML document of a text, as JSON values (empty documents skipped).
pub fn yaml_docs(text: &str, origin: &Path) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .filter_map(|doc| {
            let value = serde_yaml_ng::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: not YAML: {e}", origin.display()));
            let json: Value = serde_json::to_value(value).unwrap();
            (!json.is_null()).then_some(json)
        })
        .collect()
}

use serde::Deserialize;

/// A kustomization's fields the tests read.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Kustomization {
    pub bases: Vec<String>,
    pub resources: Vec<String>,
    pub patches_strategic_merge: Vec<String>,
    pub config_map_generator: Vec<Generator>,
    pub secret_generator: Vec<Generator>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct Generator {
    pub name: String,
    pub namespace: Option<String>,
    pub files: Vec<String>,
    pub literals: Vec<String>,
}

/// Reads `deploy/<dir>/kustomization.yaml`.
pub fn kustomization(dir: &Path) -> Kustomization {
    let path = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `kind/namespace/name` of an object, for messages.
pub fn describe(object: &Value) -> String {
    format!(
        "{}/{}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().unwrap_or("-"),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// The one object of `kind` named `name`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} among the rendered objects"))
}

/// Every object of `kind`.
pub fn all<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// Reads a value into a type the way the API server decodes it, and fails if anything in it is not a field
/// of the type (a misspelt or misplaced key, which serde would otherwise drop without a word).
pub fn strict<T: DeserializeOwned + Serialize>(value: &Value) -> Result<T, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut lost = Vec::new();
    dropped(value, &back, "", &mut lost);
    if lost.is_empty() {
        Ok(typed)
    } else {
        Err(format!("not fields of the type: {}", lost.join(", ")))
    }
}

/// Paths present (and not empty) in `before` but missing in `after`.
pub fn dropped(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (k, v) in b {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match a.get(k) {
                    Some(av) => dropped(v, av, &p, out),
                    None if !is_empty(v) => out.push(p),
                    None => {}
                }
            }
        }
        (Value::Array(b), Value::Array(a)) => {
            for (i, (bv, av)) in b.iter().zip(a).enumerate() {
                dropped(bv, av, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(o) => o.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Stand-ins for the values a Deployment reads from Secrets, by key.
pub fn secret_stand_in(key: &str) -> String {
    match key {
        "url" => "amqp://runner:Stand-in-Secret-42@rabbitmq.example.org:5672/science".into(),
        "management-url" => {
            "https://monitor:Stand-in-Secret-43@rabbitmq.example.org:15671/science".into()
        }
        other => format!("stand-in-for-{other}"),
    }
}

/// The `VOLCANO_RUNNER_*` environment the runner container gets: literal values as written, Secret
/// references as [`secret_stand_in`], the pod's namespace from the Deployment's.
pub fn runner_env(deployment: &Deployment) -> Vec<(String, String)> {
    let namespace = deployment.metadata.namespace.clone().unwrap_or_default();
    let container = &deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    container
        .env
        .iter()
        .flatten()
        .map(|e| {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => {
                    if let Some(secret) = &from.secret_key_ref {
                        secret_stand_in(&secret.key)
                    } else if let Some(field) = &from.field_ref {
                        assert_eq!(field.field_path, "metadata.namespace", "{}", e.name);
                        namespace.clone()
                    } else {
                        panic!("env {} comes from an unexpected source", e.name)
                    }
                }
                (None, None) => String::new(),
            };
            (e.name.clone(), value)
        })
        .collect()
}

/// The configuration the runner of a rendered Deployment starts with: the ConfigMap's file plus the
/// container's environment, through the program's own loader.
pub fn runner_config(objects: &[Value]) -> Config {
    let deployment: Deployment = strict(find(objects, "Deployment", "volcano-runner")).unwrap();
    let env = runner_env(&deployment);
    let config_path = env
        .iter()
        .find(|(k, _)| k == "VOLCANO_RUNNER_CONFIG")
        .map(|(_, v)| v.clone())
        .expect("VOLCANO_RUNNER_CONFIG is set");
    let file_name = Path::new(&config_path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let config_map = all(objects, "ConfigMap")
        .into_iter()
        .find(|c| c["data"].get(&file_name).is_some())
        .unwrap_or_else(|| panic!("no ConfigMap has {file_name}"));
    let text = config_map["data"][&file_name].as_str().unwrap();
    Config::from_sources(Some((Path::new(&config_path), text)), env)
        .unwrap_or_else(|e| panic!("the Deployment's configuration does not load: {e}"))
}

/// `GET http://<addr><path>`: the status, the content type and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = client
        .get(format!("http://{addr}{path}").parse().unwrap())
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// Serves `ops` on a free port until the returned token is cancelled.
pub async fn serve(
    ops: &volcano_runner::ops::Ops,
) -> (std::net::SocketAddr, tokio_util::sync::CancellationToken) {
    let config = volcano_runner::ops::OpsConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    };
    let server = ops.bind(&config).await.expect("the ops endpoint binds");
    let addr = server.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(server.run(stop.clone().cancelled_owned()));
    (addr, stop)
}

/// The permissions table under `heading` in the markdown file `doc` (columns: where, resources, verbs,
/// ...): every (where, resource, verb), with a resource's group (`jobs.batch.volcano.sh`) dropped as the
/// RBAC rules drop it.
pub fn permission_table(
    doc: &str,
    heading: &str,
) -> std::collections::BTreeSet<(String, String, String)> {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let table = text
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("{doc} has the section {heading:?}"));
    let mut documented = std::collections::BTreeSet::new();
    for line in table
        .lines()
        .skip_while(|l| !l.starts_with("| where"))
        .skip(2)
    {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (scope, resources, verbs) = (cells[1], cells[2], cells[3]);
        for resource in resources.split(',') {
            let resource = resource.trim().trim_matches('`');
            let resource = resource.split('.').next().unwrap();
            for verb in verbs.split(',') {
                documented.insert((
                    scope.to_owned(),
                    resource.to_owned(),
                    verb.trim().to_owned(),
                ));
            }
        }
    }
    documented
}
