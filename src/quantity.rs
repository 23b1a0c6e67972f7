//! Kubernetes resource quantities (`2000m`, `4Gi`, `1e3`) as numbers: the simulator's scheduler, the
//! start-time estimates and the bookings all do arithmetic on what nodes offer and pods request.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;
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
    let milli = |name: &str| {
        map.get(name)
            .and_then(|q| parse_milli(&q.0))
            .unwrap_or(0)
            .max(0)
    };
    let mib: Milli = 1024 * 1024 * 1000;
    (
        u64::try_from(milli("cpu")).unwrap_or(u64::MAX),
        u64::try_from((milli("memory") + mib - 1) / mib).unwrap_or(u64::MAX),
        u64::try_from((milli(GPU) + 999) / 1000).unwrap_or(u64::MAX),
    )
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
