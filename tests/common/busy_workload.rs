//! The busy workload of issue 32, shared by the simulator's measurement (tests/sim/busy.rs) and the two
//! runners at a ×10 clock (tests/runner/busy_runners.rs): six nodes of different shapes and a recipe of
//! jobs in three waves, varied by a seed.
#![allow(dead_code)]

use volcano_runner::sim::NodeSpec;

/// The per-project queues the jobs are spread over.
pub const QUEUES: [&str; 3] = ["proj-a", "proj-b", "proj-c"];

/// A small deterministic generator for the workloads: `next(n)` is in `0..n`.
pub fn random(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    move |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    }
}

/// One job of the workload.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The VolcanoJob's name, `j-<job id>`.
    pub name: String,
    pub queue: &'static str,
    pub ranks: u32,
    pub cpu: u32,
    pub memory_gib: u32,
    pub gpu: u32,
    pub whole_nodes: bool,
    /// `None`: no time limit.
    pub limit_s: Option<i64>,
    pub runs_s: i64,
    /// Seconds after the start of the run.
    pub arrives_s: i64,
}

impl Spec {
    /// The job id (the name without `j-`).
    pub fn job_id(&self) -> &str {
        self.name.strip_prefix("j-").unwrap_or(&self.name)
    }
}

/// Two nodes of 16 CPUs, one of 32, a high-memory node of 16 CPUs and 512 GiB, GPU nodes with 2 and 4.
pub fn nodes() -> Vec<NodeSpec> {
    let node = |name: &str, cpu: u32, memory: &str, gpus: u32| NodeSpec {
        cpu: cpu.to_string(),
        memory: memory.into(),
        gpus,
        ..NodeSpec::cpu_node(name)
    };
    vec![
        node("cpu-1", 16, "64Gi", 0),
        node("cpu-2", 16, "64Gi", 0),
        node("cpu-3", 32, "128Gi", 0),
        node("mem-1", 16, "512Gi", 0),
        node("gpu-1", 16, "64Gi", 2),
        node("gpu-2", 32, "128Gi", 4),
    ]
}

/// 90 jobs in three waves (at 0, 10 and 20 minutes) from a recipe varied by `seed`, every one with a time
/// limit, then the two that can never fit (a rank wider than any node, more GPUs than any node has).
pub fn recipe(seed: u64) -> Vec<Spec> {
    let mut next = random(seed);
    let mut out: Vec<Spec> = (0..90)
        .map(|i| {
            // (ranks, cpu, memory GiB, gpus, whole nodes)
            let (ranks, cpu, memory_gib, gpu, whole_nodes) = match next(10) {
                0..=3 => (1, 2, 4, 0, false),
                4 => (1, 4, 200, 0, false),
                5 | 6 => (1, 4, 16, 1, false),
                7 | 8 => (3, 4, 8, 0, false),
                _ => (2, 8, 16, 0, true),
            };
            let limit_s = 60 * (2 + next(9) as i64);
            let runs_s = match next(3) {
                0 => limit_s,
                1 => limit_s / 4,
                _ => limit_s / 2,
            };
            Spec {
                name: format!("j-busy{i:03}"),
                queue: QUEUES[next(3) as usize],
                ranks,
                cpu,
                memory_gib,
                gpu,
                whole_nodes,
                limit_s: Some(limit_s),
                runs_s,
                arrives_s: 600 * (i as i64 / 30),
            }
        })
        .collect();
    let never = |name: &str, cpu: u32, gpu: u32| Spec {
        name: name.into(),
        queue: QUEUES[0],
        ranks: 1,
        cpu,
        memory_gib: 8,
        gpu,
        whole_nodes: false,
        limit_s: Some(600),
        runs_s: 60,
        arrives_s: 600,
    };
    out.push(never("j-busy-wide", 64, 0));
    out.push(never("j-busy-gpus", 4, 8));
    out
}
