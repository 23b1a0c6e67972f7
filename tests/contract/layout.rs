//! The module layout holds: the dependency rules the code is organised by are checked on the sources, so
//! a change that breaks one fails here, naming the file.
//!
//! - No dependency cycle runs through the configuration: no module the configuration composes (the
//!   sections' modules) depends on it, directly or through others.
//! - The pipeline renders without the cluster layer (the Volcano types are `crate::volcano`), and the
//!   monitor does not depend on the runner.
//! - One home for the durable record and the event ids (`crate::durable`): no other file builds an event id.
//! - One `traceparent` parser (`crate::ops::trace`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A file's code without its comments and without its unit tests (which may use anything).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| match l.find(" // ") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file belongs to (`src/pipeline/plugins/task.rs` → `pipeline`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// Which top-level modules each top-level module uses (`crate::<module>` in its code).
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(&src());
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(f))
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let from = module_of(file);
        if !modules.contains(&from) {
            continue;
        }
        let code = code(file);
        let uses = graph.entry(from.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != from && modules.contains(&name) {
                uses.insert(name);
            }
        }
    }
    graph
}

/// Everything `start` depends on, directly or through others, with one path to each.
fn reachable(
    graph: &BTreeMap<String, BTreeSet<String>>,
    start: &str,
) -> BTreeMap<String, Vec<String>> {
    let mut paths: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut queue = vec![(start.to_owned(), vec![start.to_owned()])];
    while let Some((module, path)) = queue.pop() {
        for next in graph.get(&module).into_iter().flatten() {
            if !paths.contains_key(next) {
                let mut p = path.clone();
                p.push(next.clone());
                paths.insert(next.clone(), p.clone());
                queue.push((next.clone(), p));
            }
        }
    }
    paths
}

#[test]
fn no_module_the_configuration_composes_depends_on_it() {
    let graph = module_graph();
    let sections = &graph["config"];
    assert!(
        ["broker", "cluster", "pipeline", "sim", "ops"]
            .iter()
            .all(|s| sections.contains(*s)),
        "the configuration composes the library sections: {sections:?}"
    );
    let mut cycles = Vec::new();
    for section in sections {
        if let Some(path) = reachable(&graph, section).get("config") {
            cycles.push(path.join(" -> "));
        }
    }
    assert!(
        cycles.is_empty(),
        "config -> ... -> config:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_pipeline_renders_without_the_cluster_layer_and_the_monitor_without_the_runner() {
    let graph = module_graph();
    for (from, not) in [
        ("pipeline", "cluster"),
        ("pipeline", "config"),
        ("validate", "config"),
        ("monitor", "runner"),
        ("volcano", "cluster"),
        ("interval", "cluster"),
        ("interval", "forecast"),
        ("interval", "monitor"),
        ("durable", "pipeline"),
    ] {
        if let Some(path) = reachable(&graph, from).get(not) {
            panic!("{from} depends on {not}: {}", path.join(" -> "));
        }
    }
}

#[test]
fn event_ids_are_built_in_one_place() {
    let home = src().join("durable").join("ids.rs");
    let mut offenders = Vec::new();
    for file in rust_files(&src()) {
        // The simulator is not a publisher (its paths are JSON pointers into pods).
        if file == home || file.starts_with(src().join("sim")) {
            continue;
        }
        let code = code(&file);
        for (n, line) in code.lines().enumerate() {
            let builds_an_id = line.contains("event_id: format!(")
                || (line.contains("format!(")
                    && ["/rejected/", "/extend/", "/status/", "/proxy/", "/warning/"]
                        .iter()
                        .any(|p| line.contains(p)));
            if builds_an_id {
                offenders.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "event ids are built in src/durable/ids.rs only:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn one_traceparent_parser() {
    let home = src().join("ops").join("trace.rs");
    let mut parsers = Vec::new();
    for file in rust_files(&src()) {
        let code = code(&file);
        let defines = code.contains("struct TraceParent")
            || code.contains("struct TraceContext")
            || (code.to_lowercase().contains("traceparent") && code.contains(".split('-')"));
        if defines && file != home {
            parsers.push(file.display().to_string());
        }
    }
    assert!(
        parsers.is_empty(),
        "traceparent is parsed in src/ops/trace.rs only, not in: {parsers:?}"
    );
}

/// No task is spawned and forgotten: outside the simulator and the benchmark, every `tokio::spawn` keeps
/// its handle (to be joined by its owner), and everything else runs in a `JoinSet` its owner drains.
#[test]
fn every_spawned_task_has_an_owner() {
    let mut forgotten = Vec::new();
    for file in rust_files(&src()) {
        if file.starts_with(src().join("sim")) || file.starts_with(src().join("bench")) {
            continue;
        }
        for (n, line) in code(&file).lines().enumerate() {
            if line.contains("tokio::spawn(") && !line.trim_start().starts_with("let ") {
                forgotten.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        forgotten.is_empty(),
        "spawned without an owner:\n{}",
        forgotten.join("\n")
    );
}
