//! The storage behind the jobs' PersistentVolumeClaims, as a directory of the machine the simulator runs
//! on (`[sim] storage_dir`): claim `C` is `<storage_dir>/C/`, whatever the namespace (the claims of a
//! shared file system all reach the same files), and a mount with `subPath: S` is `<storage_dir>/C/S`.
//!
//! What the simulator writes there is what a job's output wrapper writes (see
//! [`crate::pipeline::plugins::output_files`]): for a container whose command is the wrapper, the rank's
//! file `stdout.txt` / `stdout-<rank>.txt` in the folder the wrapper names, holding the container's log
//! bounded as the wrapper bounds it. A real wrapper writes as the application runs; the simulator, whose
//! output is a function of time, writes the file whenever the container stops: it exits, its pod is
//! deleted (a cancel, an expiry, a node lost), so at every end the file is what the wrapper left.

use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::pipeline::plugins::output_files;
use crate::sim::json::JsonPath;

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A relative path that stays inside its base: no `..`, not absolute.
fn inside(base: &Path, relative: &str) -> Option<PathBuf> {
    let rel = Path::new(relative);
    rel.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        .then(|| base.join(rel))
}

/// Where a container's wrapper keeps the rank's output, and the bound; `None` when the container is not
/// wrapped or its folder is not on a claim.
pub fn output_file(storage: &Path, pod: &Value, container: &Value) -> Option<(PathBuf, u64)> {
    let command = strings(container.get("command"));
    let wrapped = output_files::unwrap(&command)?;
    let mount = container
        .get("volumeMounts")?
        .as_array()?
        .iter()
        .find(|m| m["mountPath"].as_str() == Some(wrapped.folder))?;
    let volume = mount["name"].as_str()?;
    let claim = pod
        .at("/spec/volumes")?
        .as_array()?
        .iter()
        .find(|v| v["name"].as_str() == Some(volume))?
        .at("/persistentVolumeClaim/claimName")?
        .as_str()?;
    let rank: u32 = container
        .get("env")
        .and_then(Value::as_array)
        .and_then(|env| {
            env.iter()
                .find(|e| e["name"].as_str() == Some("VC_TASK_INDEX"))
        })
        .and_then(|e| e["value"].as_str())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let claim_dir = inside(storage, claim)?;
    let folder = match mount.get("subPath").and_then(Value::as_str) {
        Some(sub) if !sub.is_empty() => inside(&claim_dir, sub)?,
        _ => claim_dir,
    };
    Some((
        folder.join(output_files::file_name(rank)),
        wrapped.max_bytes,
    ))
}

/// Writes the output file of every wrapped container of `pod`, with its log up to `now`. A failure to
/// write is logged: the simulated cluster goes on, as a job would whose storage failed.
/// `log_of` gives a container's log up to now (the kubelet's `pod_log`), `None` for one that never
/// started.
pub fn keep_output(storage: &Path, pod: &Value, log_of: impl Fn(Option<&str>) -> Option<String>) {
    let Some(containers) = pod.at("/spec/containers").and_then(Value::as_array) else {
        return;
    };
    for container in containers {
        let Some((path, max)) = output_file(storage, pod, container) else {
            continue;
        };
        let name = container["name"].as_str();
        // A container that never started wrote nothing, and its wrapper never created the file.
        let Some(log) = log_of(name) else {
            continue;
        };
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, output_files::KEPT.kept(log.as_bytes(), max)));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "the simulator could not write a job's output file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_file_is_under_the_claim_and_sub_path_of_the_wrapped_folder() {
        let command = vec![
            json!("/.volcano-runner/busybox"),
            json!("sh"),
            json!("-c"),
            json!(output_files::WRAPPER),
            json!(output_files::WRAPPER_NAME),
            json!("/.volcano-runner/busybox"),
            json!("/work"),
            json!("100"),
            json!("echo"),
            json!("hi"),
        ];
        let container = json!({"name": "user-job", "command": command,
            "env": [{"name": "VC_TASK_INDEX", "value": "2"}],
            "volumeMounts": [{"name": "data", "mountPath": "/work", "subPath": "home/alice/Jobs/42"}]});
        let pod = json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "cephfs"}}],
            "containers": [container.clone()]}});
        let (path, max) = output_file(Path::new("/s"), &pod, &container).unwrap();
        assert_eq!(path, Path::new("/s/cephfs/home/alice/Jobs/42/stdout-2.txt"));
        assert_eq!(max, 100);
        let mut escaping = container.clone();
        escaping["volumeMounts"][0]["subPath"] = json!("../../etc");
        assert!(output_file(Path::new("/s"), &pod, &escaping).is_none());
        let mut plain = container;
        plain["command"] = json!(["echo", "hi"]);
        assert!(output_file(Path::new("/s"), &pod, &plain).is_none());
    }
}
