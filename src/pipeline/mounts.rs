//! Where a job's files land in its containers: the mount plan of the one storage volume, computed once
//! per render (by the context, before any plugin runs) because three plugins must agree on it: FileMount
//! mounts it, Parameter passes each file as its mount point, and the output and trace wrappers write
//! under [`WORK`]. The rules are FileMount's ([`super::plugins::file_mount`] says them and why).

use crate::messages::v1::FileValue;
use crate::pipeline::located::Located;
use crate::pipeline::{PipelineError, StorageConfig};

/// Name of the storage volume in every pod.
pub const VOLUME: &str = "data";
/// Where the output folder is mounted, and the parent of every other mount.
pub const WORK: &str = "/work";

/// One mounted path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMount {
    /// The storage path, normalised (`/home/alice/x.csv`).
    pub path: String,
    /// Where the container sees it (`/work/x.csv`).
    pub mount_path: String,
    /// Inside the claim (`<subfolder>/home/alice/x.csv`).
    pub sub_path: String,
    /// Read-only when any use of the path asks for it.
    pub read_only: bool,
}

/// Where every path of a job is mounted. Computed once per render.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountPlan {
    /// The output folder's subPath, mounted read-write at `/work`.
    pub output: Option<PlannedMount>,
    /// Every other mount, in order of first use (resources, then parameters by name).
    pub mounts: Vec<PlannedMount>,
}

impl MountPlan {
    /// The mount point of a storage path the job mounts.
    pub fn mount_point(&self, path: &str) -> Option<&str> {
        let path = normalise(path).ok()?;
        self.mounts
            .iter()
            .find(|m| m.path == path)
            .map(|m| m.mount_path.as_str())
    }

    /// Where the container sees a storage path that lies inside a mounted folder (or the output folder),
    /// e.g. `/home/alice/ds/a.txt` with `/home/alice/ds` mounted at `/work/ds` gives `/work/ds/a.txt`.
    /// The most specific mount wins.
    pub fn translate(&self, path: &str) -> Option<String> {
        let path = normalise(path).ok()?;
        self.mounts
            .iter()
            .chain(self.output.iter())
            .filter_map(|m| {
                let rest = path.strip_prefix(&m.path)?;
                (rest.is_empty() || rest.starts_with('/'))
                    .then(|| (m.path.len(), format!("{}{rest}", m.mount_path)))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, p)| p)
    }

    /// True when nothing is mounted.
    pub fn is_empty(&self) -> bool {
        self.output.is_none() && self.mounts.is_empty()
    }
}

/// Plans the mounts of `files` (in order) and the output folder.
pub fn plan(
    files: &[Located<'_, FileValue>],
    output_folder: Option<&str>,
    storage: &StorageConfig,
) -> Result<MountPlan, PipelineError> {
    let subfolder = storage.subfolder.trim_matches('/');
    let sub_path = |path: &str| {
        let relative = path.trim_start_matches('/');
        if subfolder.is_empty() {
            relative.to_owned()
        } else {
            format!("{subfolder}/{relative}")
        }
    };
    let output = match output_folder {
        Some(folder) => {
            let path = normalise(folder).map_err(|m| PipelineError::invalid("outputFolder", m))?;
            Some(PlannedMount {
                sub_path: sub_path(&path),
                path,
                mount_path: WORK.to_owned(),
                read_only: false,
            })
        }
        None => None,
    };

    let mut mounts: Vec<PlannedMount> = Vec::with_capacity(files.len());
    for file in files {
        let path = normalise(&file.value.path).map_err(|m| {
            PipelineError::invalid(format!("{}.path", file.origin.field("file")), m)
        })?;
        if let Some(existing) = mounts.iter_mut().find(|m| m.path == path) {
            existing.read_only |= file.value.read_only;
            continue;
        }
        let base = path.rsplit('/').next().unwrap_or_default();
        let name = unique_name(base, &mounts);
        mounts.push(PlannedMount {
            sub_path: sub_path(&path),
            mount_path: format!("{WORK}/{name}"),
            read_only: file.value.read_only,
            path,
        });
    }
    Ok(MountPlan { output, mounts })
}

/// `/a//b/./c/` → `/a/b/c`. Refuses `..`, the storage root, and control characters.
pub fn normalise(path: &str) -> Result<String, String> {
    if path.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    let mut out = String::with_capacity(path.len() + 1);
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err("must not contain `..`".into()),
            part => {
                out.push('/');
                out.push_str(part);
            }
        }
    }
    if out.is_empty() {
        return Err("must name a file or folder, not the storage root".into());
    }
    Ok(out)
}

/// `base`, or `stem-N.ext` / `base-N` for the first N ≥ 2 not taken yet.
fn unique_name(base: &str, taken: &[PlannedMount]) -> String {
    let is_taken = |name: &str| {
        taken
            .iter()
            .any(|m| m.mount_path.strip_prefix("/work/") == Some(name))
    };
    if !is_taken(base) {
        return base.to_owned();
    }
    let (stem, ext) = match base.rfind('.') {
        Some(i) if i > 0 => base.split_at(i),
        _ => (base, ""),
    };
    (2..)
        .map(|n| format!("{stem}-{n}{ext}"))
        .find(|candidate| !is_taken(candidate))
        .unwrap_or_else(|| base.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::located::Origin;

    fn files(values: &[FileValue]) -> Vec<Located<'_, FileValue>> {
        values
            .iter()
            .enumerate()
            .map(|(i, value)| Located {
                origin: Origin::Resource(i),
                value,
            })
            .collect()
    }

    fn fv(path: &str, read_only: bool) -> FileValue {
        FileValue {
            path: path.into(),
            read_only,
        }
    }

    #[test]
    fn same_basename_gets_distinct_mount_points() {
        let values = [
            fv("/a/x.csv", true),
            fv("/b/x.csv", true),
            fv("/c/x.csv", false),
            fv("/a/ds", false),
            fv("/b/ds/", false),
        ];
        let plan = plan(&files(&values), None, &StorageConfig::default()).unwrap();
        let points: Vec<&str> = plan.mounts.iter().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(
            points,
            [
                "/work/x.csv",
                "/work/x-2.csv",
                "/work/x-3.csv",
                "/work/ds",
                "/work/ds-2"
            ]
        );
        assert_eq!(plan.mount_point("/b/x.csv"), Some("/work/x-2.csv"));
        assert_eq!(plan.mount_point("//b/ds"), Some("/work/ds-2"));
    }

    #[test]
    fn duplicates_are_mounted_once_read_only_if_any_use_is() {
        let values = [fv("/a/x.csv", false), fv("/a//x.csv", true)];
        let plan = plan(&files(&values), None, &StorageConfig::default()).unwrap();
        assert_eq!(plan.mounts.len(), 1);
        assert!(plan.mounts[0].read_only);
    }

    #[test]
    fn subfolder_and_output() {
        let storage = StorageConfig {
            subfolder: "/prod/".into(),
            ..StorageConfig::default()
        };
        let values = [fv("/home/alice/data/x.csv", true)];
        let plan = plan(&files(&values), Some("/home/alice/Jobs/42"), &storage).unwrap();
        assert_eq!(plan.mounts[0].sub_path, "prod/home/alice/data/x.csv");
        assert_eq!(
            plan.output.as_ref().unwrap().sub_path,
            "prod/home/alice/Jobs/42"
        );
        assert_eq!(
            plan.translate("/home/alice/Jobs/42/out/a.txt").as_deref(),
            Some("/work/out/a.txt")
        );
        assert_eq!(
            plan.translate("/home/alice/data/x.csv").as_deref(),
            Some("/work/x.csv")
        );
        assert_eq!(plan.translate("/home/alice/data/x.csvz"), None);
    }

    #[test]
    fn escaping_paths_are_refused() {
        let values = [fv("/home/../etc", true)];
        let err = plan(&files(&values), None, &StorageConfig::default()).unwrap_err();
        assert_eq!(err.field(), "resources[0].file.path");
        assert!(plan(&files(&[fv("/", true)]), None, &StorageConfig::default()).is_err());
        assert!(plan(&[], Some("a/../../b"), &StorageConfig::default()).is_err());
    }
}
