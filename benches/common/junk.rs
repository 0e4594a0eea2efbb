//! Classes of random letters, the junk a client can send to be estimated low (issue 31: none below
//! [`JUNK_MIN`] of o200k). Shared by `benches/estimate.rs` (which prints and gates them) and
//! `examples/fit-estimator.rs`.
#![allow(dead_code)]

/// Lowest estimate ÷ o200k allowed for a class of random letters (over its seeds).
pub const JUNK_MIN: f64 = 0.9;

/// Seeds of each class (the lowest ratio of the three is reported).
const SEEDS: [u64; 3] = [0x9E37_79B9_7F4A_7C15, 0x0123_4567_89AB_CDEF, 42];

/// Real English words of five letters or more, and short ones, to mix random words into.
const LONG: &[&str] = &[
    "request", "tokens", "provider", "quota", "bucket", "limit", "filter", "estimate", "month",
    "tenant", "charge", "answer", "model", "should", "before", "which", "there", "would", "about",
    "their", "other", "thought", "between", "people", "because", "through", "little", "always",
];
const SHORT: &[&str] = &[
    "the", "and", "for", "that", "with", "this", "from", "have", "not", "but", "are", "was", "you",
    "all", "can", "her", "one", "out", "day", "get", "use", "may", "way", "who", "its",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn lower(&mut self) -> char {
        char::from(b'a' + self.below(26) as u8)
    }
    fn mixed(&mut self) -> char {
        let c = self.lower();
        if self.next() >> 40 & 1 == 1 {
            c.to_ascii_uppercase()
        } else {
            c
        }
    }
    fn word(&mut self, lo: usize, hi: usize, letter: fn(&mut Rng) -> char) -> String {
        let n = lo + self.below(hi - lo + 1);
        (0..n).map(|_| letter(self)).collect()
    }
}

/// A text of `words` items made by `item`, joined by `sep`.
fn text(
    rng: &mut Rng,
    words: usize,
    sep: &str,
    item: &dyn Fn(&mut Rng, usize) -> String,
) -> String {
    (0..words)
        .map(|k| item(rng, k))
        .collect::<Vec<_>>()
        .join(sep)
}

/// The classes: (label, a text per seed).
pub fn classes() -> Vec<(&'static str, Vec<String>)> {
    type Make = fn(&mut Rng) -> String;
    let makers: Vec<(&'static str, Make)> = vec![
        ("lower case, words of 3", |r| {
            text(r, 300, " ", &|r, _| r.word(3, 3, Rng::lower))
        }),
        ("lower case, words of 4", |r| {
            text(r, 300, " ", &|r, _| r.word(4, 4, Rng::lower))
        }),
        ("lower case, words of 5-8", |r| {
            text(r, 200, " ", &|r, _| r.word(5, 8, Rng::lower))
        }),
        ("lower case, words of 9-20", |r| {
            text(r, 100, " ", &|r, _| r.word(9, 20, Rng::lower))
        }),
        ("lower case, one run of 2,000", |r| {
            r.word(2000, 2000, Rng::lower)
        }),
        ("capitalised, words of 3-8", |r| {
            text(r, 200, " ", &|r, _| {
                let w = r.word(3, 8, Rng::lower);
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                    .unwrap_or(w)
            })
        }),
        ("upper case, words of 3-8", |r| {
            text(r, 200, " ", &|r, _| {
                r.word(3, 8, Rng::lower).to_ascii_uppercase()
            })
        }),
        ("mixed case, words of 3-7", |r| {
            text(r, 250, " ", &|r, _| r.word(3, 7, Rng::mixed))
        }),
        ("mixed case, words of 8-20", |r| {
            text(r, 100, " ", &|r, _| r.word(8, 20, Rng::mixed))
        }),
        ("mixed case, one run of 2,000", |r| {
            r.word(2000, 2000, Rng::mixed)
        }),
        ("words of 3-4 between real words of 5+", |r| {
            text(r, 300, " ", &|r, k| {
                if k % 2 == 0 {
                    r.word(3, 4, Rng::lower)
                } else {
                    LONG[r.below(LONG.len())].to_string()
                }
            })
        }),
        ("two words of 3-4 to one real word of 5+", |r| {
            text(r, 300, " ", &|r, k| {
                if k % 3 != 2 {
                    r.word(3, 4, Rng::lower)
                } else {
                    LONG[r.below(LONG.len())].to_string()
                }
            })
        }),
        ("words of 3-4 between real words of 3-4", |r| {
            text(r, 300, " ", &|r, k| {
                if k % 2 == 0 {
                    r.word(3, 4, Rng::lower)
                } else {
                    SHORT[r.below(SHORT.len())].to_string()
                }
            })
        }),
        ("words of 3-4 after punctuation", |r| {
            text(r, 300, "", &|r, _| {
                [", ", ".", "/", "-", "_", " (", ") "][r.below(7)].to_string()
                    + &r.word(3, 4, Rng::lower)
            })
        }),
    ];
    makers
        .into_iter()
        .map(|(label, make)| {
            let texts = SEEDS.iter().map(|&s| make(&mut Rng(s))).collect();
            (label, texts)
        })
        .collect()
}

/// Per class: label, Σ o200k, Σ estimate, lowest ratio of one seed.
pub fn report(
    count: &dyn Fn(&str) -> f64,
    estimate: &dyn Fn(&str) -> f64,
) -> Vec<(&'static str, f64, f64, f64)> {
    classes()
        .into_iter()
        .map(|(label, texts)| {
            let (mut real, mut est, mut low) = (0.0, 0.0, f64::INFINITY);
            for t in &texts {
                let (r, e) = (count(t), estimate(t));
                real += r;
                est += e;
                low = f64::min(low, e / r.max(1.0));
            }
            (label, real, est, low)
        })
        .collect()
}
