//! Kubernetes resource quantities (`500m`, `2`, `1.5Gi`, `1e3`), exactly: parsed into nano-units so that the
//! agent can add the kubelet's `kubeReserved` and `systemReserved` amounts, and written back in the canonical
//! decimal form the API machinery gives a sum (`1500m`, `2`, `1610612736`, `1k`).

use std::fmt;

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not of the form `<number><suffix>`.
    #[error("{0:?} is not a Kubernetes quantity (e.g. 500m, 2, 1.5Gi)")]
    Syntax(String),
    /// The value does not fit (beyond ±10^20 units).
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// A quantity in nano-units (10⁻⁹), the finest unit Kubernetes keeps; finer fractions round up, as the API
/// machinery rounds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Quantity {
    nanos: i128,
}

/// Largest magnitude kept: 10^20 units (far beyond any amount a node reserves).
const LIMIT_NANOS: i128 = 10i128.pow(29);

/// Decimal SI suffixes and their powers of ten, largest first.
const DECIMAL_SUFFIXES: [(&str, i32); 10] = [
    ("E", 18),
    ("P", 15),
    ("T", 12),
    ("G", 9),
    ("M", 6),
    ("k", 3),
    ("", 0),
    ("m", -3),
    ("u", -6),
    ("n", -9),
];

/// Binary SI suffixes and their powers of two.
const BINARY_SUFFIXES: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];

enum Scale {
    Ten(i32),
    Two(u32),
}

fn scale_of(suffix: &str) -> Option<Scale> {
    if let Some((_, p)) = DECIMAL_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        return Some(Scale::Ten(*p));
    }
    if let Some((_, p)) = BINARY_SUFFIXES.iter().find(|(s, _)| *s == suffix) {
        return Some(Scale::Two(*p));
    }
    // A decimal exponent: e3, E-2, e+6.
    let rest = suffix.strip_prefix(['e', 'E'])?;
    let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.parse::<i32>().ok().map(Scale::Ten)
}

/// `n / 10^k`, rounded away from zero.
fn div_pow10_up(n: i128, k: u32) -> Option<i128> {
    let d = 10i128.checked_pow(k)?;
    let q = n / d;
    Some(if n % d == 0 { q } else { q + n.signum() })
}

impl Quantity {
    /// Whole units (`2` → two CPUs, two bytes).
    pub fn from_units(units: i64) -> Self {
        Self {
            nanos: i128::from(units) * 1_000_000_000,
        }
    }

    /// The value in nano-units.
    pub fn nanos(self) -> i128 {
        self.nanos
    }

    /// Whether the value is zero.
    pub fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// The sum, or `None` when it does not fit.
    pub fn checked_add(self, other: Self) -> Option<Self> {
        let nanos = self.nanos.checked_add(other.nanos)?;
        (nanos.abs() <= LIMIT_NANOS).then_some(Self { nanos })
    }

    /// Parse a quantity as the Kubernetes API machinery reads it (`<sign><digits>[.<digits>]<suffix>`, suffix one
    /// of `n u m k M G T P E`, `Ki Mi Gi Ti Pi Ei` or a decimal exponent `e<n>`).
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        let syntax = || QuantityError::Syntax(s.to_owned());
        let (negative, body) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let number_len = body
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        let (number, suffix) = body.split_at(number_len);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(syntax());
        }
        let scale = scale_of(suffix).ok_or_else(syntax)?;
        let too_large = || QuantityError::TooLarge(s.to_owned());
        // Leading zeros carry nothing; trailing fractional zeros neither.
        let int = int.trim_start_matches('0');
        let frac = frac.trim_end_matches('0');
        if int.len() + frac.len() > 30 {
            return Err(too_large());
        }
        let digits = format!("{int}{frac}");
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| syntax())?
        };
        let frac_len = i32::try_from(frac.len()).map_err(|_| too_large())?;
        let nanos = match scale {
            Scale::Ten(p) => {
                let exp = p + 9 - frac_len;
                if mantissa == 0 {
                    0
                } else if exp >= 0 {
                    let m = 10i128
                        .checked_pow(u32::try_from(exp).map_err(|_| too_large())?)
                        .ok_or_else(too_large)?;
                    mantissa.checked_mul(m).ok_or_else(too_large)?
                } else {
                    div_pow10_up(mantissa, exp.unsigned_abs()).unwrap_or(1)
                }
            }
            Scale::Two(p) => {
                let scaled = mantissa
                    .checked_mul(1i128 << p)
                    .and_then(|v| v.checked_mul(1_000_000_000))
                    .ok_or_else(too_large)?;
                div_pow10_up(scaled, frac_len.unsigned_abs()).ok_or_else(too_large)?
            }
        };
        if nanos > LIMIT_NANOS {
            return Err(too_large());
        }
        Ok(Self {
            nanos: if negative { -nanos } else { nanos },
        })
    }
}

impl fmt::Display for Quantity {
    /// The canonical decimal form: the largest SI suffix (a power of 1000, `n` to `E`) that keeps the number whole,
    /// as `resource.Quantity` prints a sum (`1500m`, `2`, `1k`, `1610612736`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        for (suffix, p) in DECIMAL_SUFFIXES {
            let unit = 10i128.pow((p + 9).unsigned_abs());
            if self.nanos % unit == 0 {
                return write!(f, "{}{suffix}", self.nanos / unit);
            }
        }
        write!(f, "{}n", self.nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn reads_the_forms_the_kubelet_configuration_uses() {
        assert_eq!(q("500m").nanos(), 500_000_000);
        assert_eq!(q("2").nanos(), 2_000_000_000);
        assert_eq!(q("1.5").nanos(), 1_500_000_000);
        assert_eq!(q("1Gi"), Quantity::from_units(1 << 30));
        assert_eq!(q("1.5Gi"), Quantity::from_units(3 << 29));
        assert_eq!(q("512Mi"), Quantity::from_units(512 << 20));
        assert_eq!(q("1k"), Quantity::from_units(1000));
        assert_eq!(q("1e3"), Quantity::from_units(1000));
        assert_eq!(q("1E3"), Quantity::from_units(1000));
        assert_eq!(q("2E"), Quantity::from_units(2_000_000_000_000_000_000));
        assert_eq!(q("+3"), Quantity::from_units(3));
        assert_eq!(q("-1"), Quantity::from_units(-1));
        assert_eq!(q(".5").nanos(), 500_000_000);
        assert_eq!(q("5.").nanos(), 5_000_000_000);
        assert_eq!(q("0.0000000001").nanos(), 1, "below a nano-unit rounds up");
        assert_eq!(q("100u").nanos(), 100_000);
        for bad in [
            "", "m", "1.2.3", "1 Gi", "1gi", "1KiB", "--1", "1e", "e3", "0x10", " 1",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            Quantity::parse("99999999999999999999999999999999Ei"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn prints_sums_as_the_api_machinery_does() {
        let sum = |a: &str, b: &str| {
            q(a).checked_add(q(b))
                .unwrap_or_else(|| panic!("overflow"))
                .to_string()
        };
        assert_eq!(sum("500m", "1"), "1500m");
        assert_eq!(sum("1", "1"), "2");
        assert_eq!(sum("1Gi", "512Mi"), "1610612736");
        assert_eq!(sum("500", "500"), "1k");
        assert_eq!(sum("0", "0"), "0");
        assert_eq!(q("2M").to_string(), "2M");
        assert_eq!(q("1500k").to_string(), "1500k");
        assert_eq!(q("-250m").to_string(), "-250m");
        assert_eq!(q("1n").to_string(), "1n");
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(s in "\\PC{0,40}") {
            let _ = Quantity::parse(&s);
        }

        #[test]
        fn quantity_like_text_never_panics(s in "[+-]?[0-9.]{0,35}(|[numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]{1,5})") {
            let _ = Quantity::parse(&s);
        }

        #[test]
        fn printed_quantities_read_back_equal(
            whole in 0u64..1_000_000,
            frac in 0u32..1000,
            suffix in prop::sample::select(vec!["", "m", "k", "M", "G", "Ki", "Mi", "Gi", "Ti", "e2", "e-1"]),
            negative: bool,
        ) {
            let text = format!("{}{whole}.{frac:03}{suffix}", if negative { "-" } else { "" });
            let parsed = Quantity::parse(&text).unwrap();
            prop_assert_eq!(Quantity::parse(&parsed.to_string()), Ok(parsed));
        }
    }
}
