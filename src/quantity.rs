//! Kubernetes resource quantities (`2000m`, `4Gi`, `1e3`) as numbers: the simulator's scheduler, the
//! start-time estimates and the bookings all do arithmetic on what nodes offer and pods request.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The extended resource of a GPU, as the runner renders it and the device plugin offers it.
pub const GPU: &str = "nvidia.com/gpu";

/// A quantity in thousandths of its unit (millicores for cpu, millibytes for memory), as
/// `resource.Quantity.MilliValue()` gives it. `i128` holds `1Ei * 1000` without overflow.
pub type Milli = i128;

/// Parses a quantity string into milli-units, rounding up like `MilliValue`. `None` when malformed.
pub fn parse_milli(s: &str) -> Option<Milli> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let (negative, rest) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(num_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{int_part}{frac_part}");
    if digits.len() > 30 {
        return None;
    }
    let mantissa: i128 = digits.parse().ok()?;
    let mut exp10: i32 = -(frac_part.len() as i32);
    let mut exp2: u32 = 0;
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        other => {
            let exp = other
                .strip_prefix('e')
                .or_else(|| other.strip_prefix('E'))?;
            let e: i32 = exp.parse().ok()?;
            if !(-30..=30).contains(&e) {
                return None;
            }
            exp10 += e;
        }
    }
    // milli = mantissa * 2^exp2 * 10^(exp10 + 3), rounded up.
    let mut value = mantissa.checked_mul(1i128.checked_shl(exp2)?)?;
    let scale = exp10 + 3;
    if scale >= 0 {
        value = value.checked_mul(10i128.checked_pow(scale as u32)?)?;
    } else {
        let div = 10i128.checked_pow((-scale) as u32)?;
        value = (value + div - 1) / div;
    }
    Some(if negative { -value } else { value })
}

/// CPU in millicores, memory in MiB and GPUs of a resource map (a node's allocatable, a container's
/// requests), memory and GPUs rounded up; a missing, malformed or negative quantity counts 0.
pub fn cpu_memory_gpu(map: &BTreeMap<String, Quantity>) -> (u64, u64, u64) {
    cpu_memory_gpu_of(&millis_of(map))
}

/// What a pod asks the scheduler for, as [`cpu_memory_gpu`] gives it: CPU in millicores, memory in MiB
/// and GPUs, by the rule of [`pod_requests`]. The bookings and the monitor's estimates both count a
/// pod this way, so that they agree with each other and with the scheduler.
pub fn pod_cpu_memory_gpu(spec: &PodSpec) -> (u64, u64, u64) {
    cpu_memory_gpu_of(&pod_requests(spec))
}

/// A resource map in milli-units, resource by resource.
pub type Millis = BTreeMap<String, Milli>;

/// [`cpu_memory_gpu`] of a map already in milli-units.
fn cpu_memory_gpu_of(map: &Millis) -> (u64, u64, u64) {
    let milli = |name: &str| map.get(name).copied().unwrap_or(0).max(0);
    let mib: Milli = 1024 * 1024 * 1000;
    (
        u64::try_from(milli("cpu")).unwrap_or(u64::MAX),
        u64::try_from((milli("memory") + mib - 1) / mib).unwrap_or(u64::MAX),
        u64::try_from((milli(GPU) + 999) / 1000).unwrap_or(u64::MAX),
    )
}

/// A quantity map in milli-units; a malformed or negative quantity counts 0.
fn millis_of(map: &BTreeMap<String, Quantity>) -> Millis {
    map.iter()
        .map(|(k, q)| (k.clone(), parse_milli(&q.0).unwrap_or(0).max(0)))
        .collect()
}

/// Adds `more` to `total`, resource by resource.
fn add(total: &mut Millis, more: &Millis) {
    for (k, v) in more {
        let t = total.entry(k.clone()).or_insert(0);
        *t = t.saturating_add(*v);
    }
}

/// Raises `total` to at least `other`, resource by resource.
fn at_least(total: &mut Millis, other: &Millis) {
    for (k, v) in other {
        let t = total.entry(k.clone()).or_insert(0);
        *t = (*t).max(*v);
    }
}

/// What a pod asks the scheduler for, resource by resource, in milli-units, by the rule Kubernetes'
/// scheduler and kubelet apply (`PodRequests`; see [`requests_of_parts`]). Each container counts by
/// [`container_requests`].
fn pod_requests(spec: &PodSpec) -> Millis {
    requests_of_parts(
        spec.containers
            .iter()
            .map(|c| millis_of(&container_requests(c))),
        spec.init_containers.iter().flatten().map(|c| {
            (
                millis_of(&container_requests(c)),
                c.restart_policy.as_deref() == Some("Always"),
            )
        }),
        spec.overhead.as_ref().map(millis_of),
    )
}

/// Kubernetes' pod request rule (`PodRequests`) over a pod's parts, each already a resource map: its
/// containers added up, and its sidecars with them (`init_containers` flagged `true`: init containers
/// with `restartPolicy: Always` keep running beside the containers); at least what the init phase
/// needs at its peak (an ordinary init container runs alone beside the sidecars started before it, a
/// sidecar beside those before it); plus the pod's `overhead` (its RuntimeClass's, set on admission).
/// One rule for the typed pods of the bookings and the monitor and the JSON pods of the simulator's
/// scheduler, so that they agree.
pub fn requests_of_parts(
    containers: impl IntoIterator<Item = Millis>,
    init_containers: impl IntoIterator<Item = (Millis, bool)>,
    overhead: Option<Millis>,
) -> Millis {
    let mut total = Millis::new();
    for own in containers {
        add(&mut total, &own);
    }
    let mut sidecars = Millis::new();
    let mut init_peak = Millis::new();
    for (own, sidecar) in init_containers {
        if sidecar {
            add(&mut total, &own);
            add(&mut sidecars, &own);
            at_least(&mut init_peak, &sidecars);
        } else {
            let mut during = sidecars.clone();
            add(&mut during, &own);
            at_least(&mut init_peak, &during);
        }
    }
    at_least(&mut total, &init_peak);
    if let Some(overhead) = overhead {
        add(&mut total, &overhead);
    }
    total
}

/// What a container asks the scheduler for, resource by resource: its requests, and its limits where a
/// request is missing (Kubernetes defaults a missing request to the limit).
pub fn container_requests(c: &Container) -> BTreeMap<String, Quantity> {
    let mut map = c
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    if let Some(requests) = c.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        map.extend(requests.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_requests_its_limits_where_a_request_is_missing() {
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "resources": {
                "limits": {"cpu": "4", "memory": "8Gi", GPU: "1"},
                "requests": {"cpu": "1500m"}
            }
        }))
        .unwrap();
        let map = container_requests(&c);
        assert_eq!(map["cpu"].0, "1500m", "the request, not the limit");
        assert_eq!(
            map["memory"].0, "8Gi",
            "the limit where no request is given"
        );
        assert_eq!(cpu_memory_gpu(&map), (1500, 8192, 1));
        let bare: Container = serde_json::from_value(serde_json::json!({"name": "c"})).unwrap();
        assert_eq!(cpu_memory_gpu(&container_requests(&bare)), (0, 0, 0));
    }

    fn pod(spec: serde_json::Value) -> PodSpec {
        serde_json::from_value(spec).unwrap()
    }

    /// The containers add up; an init container larger than their sum sets the pod's request, one
    /// resource at a time; a smaller one changes nothing.
    #[test]
    fn a_pod_requests_its_containers_or_its_largest_init_container() {
        let spec = pod(serde_json::json!({
            "initContainers": [
                {"name": "fetch", "resources": {"requests": {"cpu": "8", "memory": "1Gi"}}},
                {"name": "small", "resources": {"requests": {"cpu": "1"}}}
            ],
            "containers": [
                {"name": "a", "resources": {"limits": {"cpu": "2", "memory": "4Gi", GPU: "1"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}
            ]
        }));
        assert_eq!(pod_cpu_memory_gpu(&spec), (8000, 6144, 1));
        let plain = pod(serde_json::json!({"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1"}}},
            {"name": "b", "resources": {"requests": {"cpu": "500m", "memory": "1"}}}
        ]}));
        assert_eq!(
            pod_cpu_memory_gpu(&plain),
            (1000, 1, 0),
            "memory adds up in bytes before it rounds to MiB"
        );
        assert_eq!(pod_cpu_memory_gpu(&PodSpec::default()), (0, 0, 0));
    }

    /// A sidecar (an init container with `restartPolicy: Always`) runs beside the containers, so it adds
    /// to their sum; an ordinary init container after it runs beside it, so the init phase's peak is
    /// both together.
    #[test]
    fn sidecars_add_to_the_containers_and_to_the_init_containers_after_them() {
        let spec = pod(serde_json::json!({
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                {"name": "migrate", "resources": {"requests": {"cpu": "3"}}}
            ],
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "2"}}}]
        }));
        assert_eq!(
            pod_cpu_memory_gpu(&spec).0,
            4000,
            "init phase: proxy 1 + migrate 3 = 4 > running: app 2 + proxy 1 = 3"
        );
        let before = pod(serde_json::json!({
            "initContainers": [
                {"name": "migrate", "resources": {"requests": {"cpu": "3"}}},
                {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}
            ],
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "2"}}}]
        }));
        assert_eq!(
            pod_cpu_memory_gpu(&before).0,
            3000,
            "migrate ran before the proxy started: max(3, 2 + 1)"
        );
        let big_sidecar = pod(serde_json::json!({
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "5"}}}
            ],
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "2"}}}]
        }));
        assert_eq!(pod_cpu_memory_gpu(&big_sidecar).0, 7000);
    }

    /// A pod's overhead (its RuntimeClass's) comes on top of what its containers request.
    #[test]
    fn the_overhead_comes_on_top() {
        let spec = pod(serde_json::json!({
            "overhead": {"cpu": "250m", "memory": "120Mi"},
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]
        }));
        assert_eq!(pod_cpu_memory_gpu(&spec), (1250, 1144, 0));
    }

    #[test]
    fn memory_and_gpus_round_up_and_nonsense_counts_nothing() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                .collect()
        };
        assert_eq!(
            cpu_memory_gpu(&map(&[("cpu", "250m"), ("memory", "1"), (GPU, "500m")])),
            (250, 1, 1)
        );
        assert_eq!(
            cpu_memory_gpu(&map(&[("cpu", "-1"), ("memory", "lots")])),
            (0, 0, 0)
        );
    }

    #[test]
    fn parses_the_usual_forms() {
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("2000m"), Some(2000));
        assert_eq!(parse_milli("100m"), Some(100));
        assert_eq!(parse_milli("0.5"), Some(500));
        assert_eq!(parse_milli("4Gi"), Some(4 * (1 << 30) * 1000));
        assert_eq!(parse_milli("1k"), Some(1_000_000));
        assert_eq!(parse_milli("1e3"), Some(1_000_000));
        assert_eq!(parse_milli("1n"), Some(1));
        assert_eq!(parse_milli("-1"), Some(-1000));
        assert_eq!(parse_milli("1.5Mi"), Some(1_572_864_000));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "abc", "1x", "1.2.3", "Gi", "."] {
            assert_eq!(parse_milli(bad), None, "{bad}");
        }
    }
}
