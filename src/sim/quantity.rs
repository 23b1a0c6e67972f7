//! Kubernetes resource quantities (`2000m`, `4Gi`, `1e3`), for the scheduler's arithmetic.

use std::collections::BTreeMap;

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
