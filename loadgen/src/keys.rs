//! Record keys for `--keys none|uniform:N|zipf:N:S`: which key each message
//! carries, drawn from a seeded generator so a run is reproducible with
//! `--seed`. Zipf models hot keys (rank k has weight 1/k^S). Key bytes are
//! `key-<index>`; the broker's partitioner decides where they land.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// Bound on distinct keys for `uniform` (they cost nothing to store).
pub const UNIFORM_KEYS_MAX: u64 = 1_000_000_000;
/// Bound on distinct keys for `zipf`: its CDF table is 8 bytes per key.
pub const ZIPF_KEYS_MAX: u64 = 1_000_000;
/// Bound on the zipf exponent; beyond this nearly every draw is key 0.
pub const ZIPF_EXPONENT_MAX: f64 = 10.0;

/// Why a `--keys` value was rejected.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum KeySpecError {
    #[error("--keys {0:?}: expected none, uniform:N or zipf:N:S")]
    Syntax(String),
    #[error("--keys {input:?}: key count must be 1..={max}")]
    Count { input: String, max: u64 },
    #[error("--keys {input:?}: zipf exponent must be in (0, {ZIPF_EXPONENT_MAX}]")]
    Exponent { input: String },
}

/// The parsed `--keys` flag.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeySpec {
    None,
    Uniform { keys_count: u64 },
    Zipf { keys_count: u64, exponent: f64 },
}

impl FromStr for KeySpec {
    type Err = KeySpecError;

    fn from_str(input: &str) -> Result<KeySpec, KeySpecError> {
        let syntax = || KeySpecError::Syntax(input.to_string());
        let parts: Vec<&str> = input.split(':').collect();
        let count = |text: &str, max: u64| -> Result<u64, KeySpecError> {
            let keys_count: u64 = text.replace('_', "").parse().map_err(|_| syntax())?;
            if keys_count == 0 || keys_count > max {
                return Err(KeySpecError::Count {
                    input: input.to_string(),
                    max,
                });
            }
            Ok(keys_count)
        };
        match parts.as_slice() {
            ["none"] => Ok(KeySpec::None),
            ["uniform", n] => Ok(KeySpec::Uniform {
                keys_count: count(n, UNIFORM_KEYS_MAX)?,
            }),
            ["zipf", n, s] => {
                let exponent: f64 = s.parse().map_err(|_| syntax())?;
                if !(exponent > 0.0 && exponent <= ZIPF_EXPONENT_MAX) {
                    return Err(KeySpecError::Exponent {
                        input: input.to_string(),
                    });
                }
                Ok(KeySpec::Zipf {
                    keys_count: count(n, ZIPF_KEYS_MAX)?,
                    exponent,
                })
            }
            _ => Err(syntax()),
        }
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySpec::None => write!(f, "none"),
            KeySpec::Uniform { keys_count } => write!(f, "uniform:{keys_count}"),
            KeySpec::Zipf {
                keys_count,
                exponent,
            } => write!(f, "zipf:{keys_count}:{exponent}"),
        }
    }
}

/// Derives an independent seed for stream `stream` (a worker index) from
/// the run seed (SplitMix64 finaliser), so workers do not share sequences.
pub fn derive_seed(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Draws key indexes according to a `KeySpec`.
#[derive(Debug, Clone)]
pub struct KeyGenerator {
    spec: KeySpec,
    rng: fastrand::Rng,
    /// Zipf only: cumulative probability of ranks 0..=k, last entry 1.0.
    zipf_cdf: Vec<f64>,
}

impl KeyGenerator {
    /// The spec was validated by parsing, so construction cannot fail; the
    /// bounds are asserted again because the table size depends on them.
    pub fn new(spec: KeySpec, seed: u64) -> KeyGenerator {
        let zipf_cdf = match spec {
            KeySpec::Zipf {
                keys_count,
                exponent,
            } => {
                assert!((1..=ZIPF_KEYS_MAX).contains(&keys_count));
                zipf_cdf(keys_count, exponent)
            }
            _ => Vec::new(),
        };
        KeyGenerator {
            spec,
            rng: fastrand::Rng::with_seed(seed),
            zipf_cdf,
        }
    }

    pub fn spec(&self) -> KeySpec {
        self.spec
    }

    /// The next key's index, or `None` when messages carry no key.
    pub fn next_key_index(&mut self) -> Option<u64> {
        match self.spec {
            KeySpec::None => None,
            KeySpec::Uniform { keys_count } => Some(self.rng.u64(0..keys_count)),
            KeySpec::Zipf { .. } => {
                let draw = self.rng.f64();
                let rank = self
                    .zipf_cdf
                    .partition_point(|&cumulative| cumulative <= draw);
                Some(rank.min(self.zipf_cdf.len() - 1) as u64)
            }
        }
    }

    /// Appends the key bytes for `index` (`key-<index>`) to `out`.
    pub fn write_key(index: u64, out: &mut Vec<u8>) {
        use std::io::Write as _;
        write!(out, "key-{index}").expect("writing to a Vec cannot fail");
    }

    /// The next key as bytes, allocating; `None` when unkeyed.
    pub fn next_key(&mut self) -> Option<Vec<u8>> {
        self.next_key_index().map(|index| {
            let mut key = Vec::with_capacity(24);
            KeyGenerator::write_key(index, &mut key);
            key
        })
    }
}

fn zipf_cdf(keys_count: u64, exponent: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=keys_count)
        .map(|rank| (rank as f64).powf(-exponent))
        .collect();
    let total: f64 = weights.iter().sum();
    let mut cumulative = 0.0;
    let mut cdf: Vec<f64> = weights
        .iter()
        .map(|weight| {
            cumulative += weight / total;
            cumulative
        })
        .collect();
    // Rounding may leave the last entry a hair under 1.0; a draw must never fall past it.
    *cdf.last_mut().expect("keys_count >= 1") = 1.0;
    cdf
}

#[cfg(test)]
mod tests {
    use super::*;

    // Parsing accepts the three forms and names the problem otherwise.
    #[test]
    fn parses_specs() {
        assert_eq!("none".parse::<KeySpec>().unwrap(), KeySpec::None);
        assert_eq!(
            "uniform:1000".parse::<KeySpec>().unwrap(),
            KeySpec::Uniform { keys_count: 1000 }
        );
        assert_eq!(
            "zipf:100:1.1".parse::<KeySpec>().unwrap(),
            KeySpec::Zipf {
                keys_count: 100,
                exponent: 1.1
            }
        );
        assert!(matches!(
            "zipf:100".parse::<KeySpec>(),
            Err(KeySpecError::Syntax(_))
        ));
        assert!(matches!(
            "uniform:0".parse::<KeySpec>(),
            Err(KeySpecError::Count { .. })
        ));
        assert!(matches!(
            "zipf:2000000:1".parse::<KeySpec>(),
            Err(KeySpecError::Count { .. })
        ));
        assert!(matches!(
            "zipf:10:0".parse::<KeySpec>(),
            Err(KeySpecError::Exponent { .. })
        ));
        assert_eq!(
            "zipf:100:1.1".parse::<KeySpec>().unwrap().to_string(),
            "zipf:100:1.1"
        );
    }

    // The same seed gives the same keys; a different seed does not.
    #[test]
    fn deterministic_with_seed() {
        let spec = KeySpec::Zipf {
            keys_count: 1000,
            exponent: 1.0,
        };
        let draw = |seed| {
            let mut generator = KeyGenerator::new(spec, seed);
            (0..1000)
                .map(|_| generator.next_key_index().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
        assert_ne!(derive_seed(42, 0), derive_seed(42, 1));
    }

    // Zipf skew: rank 0 gets about 1/H(N,s) of draws and rank 0 : rank 1 ≈ 2^s.
    #[test]
    fn zipf_skew_sanity() {
        let mut generator = KeyGenerator::new(
            KeySpec::Zipf {
                keys_count: 100,
                exponent: 1.0,
            },
            7,
        );
        let mut counts = [0u64; 100];
        let draws = 200_000;
        for _ in 0..draws {
            counts[generator.next_key_index().unwrap() as usize] += 1;
        }
        let harmonic: f64 = (1..=100).map(|k| 1.0 / k as f64).sum();
        let share0 = counts[0] as f64 / draws as f64;
        assert!(
            (share0 - 1.0 / harmonic).abs() < 0.01,
            "rank 0 share {share0}"
        );
        let ratio = counts[0] as f64 / counts[1] as f64;
        assert!((ratio - 2.0).abs() < 0.15, "rank0/rank1 {ratio}");
        assert!(counts[0] > counts[9] * 5);
        assert!(counts.iter().all(|&count| count > 0), "every key drawn");
    }

    // Uniform keys stay in range and spread evenly; none gives no key.
    #[test]
    fn uniform_and_none() {
        let mut generator = KeyGenerator::new(KeySpec::Uniform { keys_count: 10 }, 1);
        let mut counts = [0u64; 10];
        for _ in 0..100_000 {
            counts[generator.next_key_index().unwrap() as usize] += 1;
        }
        assert!(counts.iter().all(|&count| (9_000..11_000).contains(&count)));
        assert_eq!(KeyGenerator::new(KeySpec::None, 1).next_key(), None);
        let mut key = Vec::new();
        KeyGenerator::write_key(42, &mut key);
        assert_eq!(key, b"key-42");
    }
}
