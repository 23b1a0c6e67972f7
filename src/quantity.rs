//! Kubernetes resource quantities (`2000m`, `4Gi`, `1e3`) as numbers: the simulator's scheduler and the
//! start-time estimates both do arithmetic on what nodes offer and pods request.

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
}
