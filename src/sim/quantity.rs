//! Kubernetes resource quantities (`2000m`, `4Gi`, `1e3`), for the scheduler's arithmetic.

use std::collections::BTreeMap;

pub use crate::quantity::{Milli, parse_milli};

/// Formats milli-cpu the way `kubectl` shows it: `2`, `2500m`.
pub fn format_cpu(milli: Milli) -> String {
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// Formats bytes (given in milli-units) with the largest exact binary suffix: `64Gi`, `1500`.
pub fn format_bytes(milli: Milli) -> String {
    let bytes = milli / 1000;
    if milli % 1000 != 0 {
        return format!("{milli}m");
    }
    for (suffix, shift) in [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ] {
        let unit = 1i128 << shift;
        if bytes != 0 && bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// Formats a resource amount by its name: cpu in cores, memory-like names in bytes, others as counts.
pub fn format_resource(name: &str, milli: Milli) -> String {
    if name == "cpu" {
        format_cpu(milli)
    } else if name.contains("memory") || name.contains("storage") {
        format_bytes(milli)
    } else {
        format_cpu(milli)
    }
}

/// A set of named resource amounts (`cpu`, `memory`, `nvidia.com/gpu`, `pods`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources(pub BTreeMap<String, Milli>);

impl Resources {
    /// The amount of one resource (0 when absent).
    pub fn get(&self, name: &str) -> Milli {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// Adds another set element-wise (allocating).
    pub fn add(&mut self, other: &Resources) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_insert(0) += v;
        }
    }

    /// Subtracts another set element-wise (releasing).
    pub fn sub(&mut self, other: &Resources) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_insert(0) -= v;
        }
    }

    /// Element-wise maximum (a pod's effective request against its init containers).
    pub fn max_with(&mut self, other: &Resources) {
        for (k, v) in &other.0 {
            let e = self.0.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
    }

    /// The resources of `self` that exceed what `free` offers, by name.
    pub fn shortfall(&self, free: &Resources) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, v)| **v > 0 && **v > free.get(k))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether every requested amount is available in `free`.
    pub fn fits_in(&self, free: &Resources) -> bool {
        self.shortfall(free).is_empty()
    }

    /// Scales every amount by `factor` (the enqueue over-commit factor).
    pub fn scaled(&self, factor: f64) -> Resources {
        Resources(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), (*v as f64 * factor) as Milli))
                .collect(),
        )
    }

    /// Parses a `{name: quantity}` JSON map; malformed entries are skipped (schema validation reports them).
    pub fn from_json(map: Option<&serde_json::Value>) -> Resources {
        let mut out = Resources::default();
        if let Some(serde_json::Value::Object(m)) = map {
            for (k, v) in m {
                let parsed = match v {
                    serde_json::Value::String(s) => parse_milli(s),
                    serde_json::Value::Number(n) => {
                        n.as_f64().map(|f| (f * 1000.0).ceil() as Milli)
                    }
                    _ => None,
                };
                if let Some(p) = parsed {
                    out.0.insert(k.clone(), p);
                }
            }
        }
        out
    }

    /// The `{name: quantity}` map Kubernetes objects carry, zero amounts left out.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.0
                .iter()
                .filter(|(_, v)| **v != 0)
                .map(|(k, v)| (k.clone(), serde_json::Value::String(format_resource(k, *v))))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(format_cpu(16000), "16");
        assert_eq!(format_cpu(2500), "2500m");
        assert_eq!(format_bytes(64 * (1 << 30) * 1000), "64Gi");
        assert_eq!(format_bytes(1500 * 1000), "1500");
    }

    #[test]
    fn shortfall_names_the_missing_resource() {
        let mut want = Resources::default();
        want.0.insert("cpu".into(), 20_000);
        want.0.insert("memory".into(), 1000);
        let mut free = Resources::default();
        free.0.insert("cpu".into(), 16_000);
        free.0.insert("memory".into(), 1 << 40);
        assert_eq!(want.shortfall(&free), vec!["cpu".to_string()]);
        assert!(!want.fits_in(&free));
    }
}
