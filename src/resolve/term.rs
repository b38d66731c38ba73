//! Sets of candidates of one name (bitsets over its preference order) and the
//! PubGrub terms built on them.
//!
//! Bit `i` of a name's set is the name's `i`-th most preferred candidate, so
//! the lowest set bit is the best choice.

/// A set of candidate positions. Names with at most 64 candidates (nearly all)
/// never allocate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Bits {
    Small(u64),
    Large(Box<[u64]>),
}

impl Bits {
    pub(super) fn empty() -> Self {
        Bits::Small(0)
    }

    /// All positions below `width`.
    pub(super) fn full(width: usize) -> Self {
        let mut bits = Bits::empty();
        for i in 0..width {
            bits.insert(i);
        }
        bits
    }

    pub(super) fn single(i: usize) -> Self {
        let mut bits = Bits::empty();
        bits.insert(i);
        bits
    }

    pub(super) fn insert(&mut self, i: usize) {
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        match self {
            Bits::Small(w) if word == 0 => *w |= bit,
            Bits::Small(w) => {
                let mut words = vec![0u64; word + 1];
                words[0] = *w;
                words[word] |= bit;
                *self = Bits::Large(words.into_boxed_slice());
            }
            Bits::Large(words) => {
                if word >= words.len() {
                    let mut grown = words.to_vec();
                    grown.resize(word + 1, 0);
                    *words = grown.into_boxed_slice();
                }
                if let Some(w) = words.get_mut(word) {
                    *w |= bit;
                }
            }
        }
    }

    fn words(&self) -> &[u64] {
        match self {
            Bits::Small(w) => std::slice::from_ref(w),
            Bits::Large(words) => words,
        }
    }

    fn zip(&self, other: &Self, f: impl Fn(u64, u64) -> u64) -> Self {
        match (self, other) {
            (Bits::Small(a), Bits::Small(b)) => Bits::Small(f(*a, *b)),
            (a, b) => {
                let (a, b) = (a.words(), b.words());
                let len = a.len().max(b.len());
                let word = |s: &[u64], i: usize| s.get(i).copied().unwrap_or(0);
                Bits::Large((0..len).map(|i| f(word(a, i), word(b, i))).collect())
            }
        }
    }

    pub(super) fn and(&self, other: &Self) -> Self {
        self.zip(other, |a, b| a & b)
    }

    pub(super) fn or(&self, other: &Self) -> Self {
        self.zip(other, |a, b| a | b)
    }

    pub(super) fn and_not(&self, other: &Self) -> Self {
        self.zip(other, |a, b| a & !b)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.words().iter().all(|w| *w == 0)
    }

    /// `self ⊆ other`.
    pub(super) fn is_subset(&self, other: &Self) -> bool {
        match (self, other) {
            (Bits::Small(a), Bits::Small(b)) => a & !b == 0,
            (a, b) => a.and_not(b).is_empty(),
        }
    }

    pub(super) fn is_disjoint(&self, other: &Self) -> bool {
        match (self, other) {
            (Bits::Small(a), Bits::Small(b)) => a & b == 0,
            (a, b) => a.and(b).is_empty(),
        }
    }

    pub(super) fn contains(&self, i: usize) -> bool {
        self.words()
            .get(i / 64)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }

    pub(super) fn first(&self) -> Option<usize> {
        self.ones().next()
    }

    pub(super) fn count(&self) -> u32 {
        self.words().iter().map(|w| w.count_ones()).sum()
    }

    pub(super) fn ones(&self) -> impl Iterator<Item = usize> + '_ {
        self.words().iter().enumerate().flat_map(|(i, &w)| {
            let mut rest = w;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some(i * 64 + bit)
            })
        })
    }
}

/// A PubGrub term about one name: `Pos(S)` is "chosen, with a candidate in
/// S"; `Neg(S)` is its negation, "absent, or chosen outside S". `Neg(∅)`
/// holds always, `Pos(∅)` never.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Term {
    pub(super) positive: bool,
    pub(super) set: Bits,
}

impl Term {
    pub(super) fn pos(set: Bits) -> Self {
        Term {
            positive: true,
            set,
        }
    }

    pub(super) fn neg(set: Bits) -> Self {
        Term {
            positive: false,
            set,
        }
    }

    pub(super) fn any() -> Self {
        Term::neg(Bits::empty())
    }

    pub(super) fn is_any(&self) -> bool {
        !self.positive && self.set.is_empty()
    }

    pub(super) fn negate(&self) -> Self {
        Term {
            positive: !self.positive,
            set: self.set.clone(),
        }
    }

    pub(super) fn intersect(&self, other: &Term) -> Term {
        match (self.positive, other.positive) {
            (true, true) => Term::pos(self.set.and(&other.set)),
            (true, false) => Term::pos(self.set.and_not(&other.set)),
            (false, true) => Term::pos(other.set.and_not(&self.set)),
            (false, false) => Term::neg(self.set.or(&other.set)),
        }
    }

    pub(super) fn union(&self, other: &Term) -> Term {
        match (self.positive, other.positive) {
            (true, true) => Term::pos(self.set.or(&other.set)),
            (true, false) => Term::neg(other.set.and_not(&self.set)),
            (false, true) => Term::neg(self.set.and_not(&other.set)),
            (false, false) => Term::neg(self.set.and(&other.set)),
        }
    }

    /// Whether every assignment allowed by `acc` satisfies `self` (acc ⊆ self).
    pub(super) fn satisfied_by(&self, acc: &Term) -> bool {
        match (acc.positive, self.positive) {
            (true, true) => acc.set.is_subset(&self.set),
            // `acc` allows "absent", which a positive term excludes.
            (false, true) => false,
            (true, false) => acc.set.is_disjoint(&self.set),
            (false, false) => self.set.is_subset(&acc.set),
        }
    }

    /// Whether no assignment allowed by `acc` satisfies `self` (acc ∩ self = ∅).
    pub(super) fn contradicted_by(&self, acc: &Term) -> bool {
        match (acc.positive, self.positive) {
            (true, true) => acc.set.is_disjoint(&self.set),
            (false, true) => self.set.is_subset(&acc.set),
            (true, false) => acc.set.is_subset(&self.set),
            // Both allow "absent".
            (false, false) => false,
        }
    }

    /// Whether candidate position `i` being chosen satisfies the term.
    pub(super) fn contains(&self, i: usize) -> bool {
        self.set.contains(i) == self.positive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bits(mask: u64) -> Bits {
        Bits::Small(mask)
    }

    /// The states a term over 4 candidates allows: `None` is "absent".
    fn states(t: &Term) -> Vec<Option<usize>> {
        let mut out = Vec::new();
        if !t.positive {
            out.push(None);
        }
        out.extend((0..4).filter(|&i| t.contains(i)).map(Some));
        out
    }

    fn term() -> impl Strategy<Value = Term> {
        (any::<bool>(), 0u64..16).prop_map(|(p, m)| Term {
            positive: p,
            set: bits(m),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn term_algebra_matches_sets(a in term(), b in term()) {
            let (sa, sb) = (states(&a), states(&b));
            let inter: Vec<_> = sa.iter().filter(|s| sb.contains(s)).copied().collect();
            let mut union = sa.clone();
            union.extend(sb.iter().filter(|s| !sa.contains(s)));
            union.sort();
            let mut got_union = states(&a.union(&b));
            got_union.sort();
            prop_assert_eq!(states(&a.intersect(&b)), inter.clone());
            prop_assert_eq!(got_union, union);
            prop_assert_eq!(b.satisfied_by(&a), sa.iter().all(|s| sb.contains(s)));
            prop_assert_eq!(b.contradicted_by(&a), inter.is_empty());
        }

        #[test]
        fn large_bits_agree_with_small(a in any::<u64>(), b in any::<u64>()) {
            let large = |m: u64| {
                let mut x = Bits::single(100);
                for i in (0..64).filter(|i| m & (1 << i) != 0) { x.insert(i); }
                x
            };
            let strip = |x: Bits| x.ones().filter(|&i| i < 64).collect::<Vec<_>>();
            prop_assert_eq!(strip(large(a).and(&large(b))), strip(bits(a & b)));
            prop_assert_eq!(strip(large(a).and_not(&bits(b))), strip(bits(a & !b)));
            prop_assert_eq!(large(a).is_subset(&large(b)), a & !b == 0);
            prop_assert_eq!(large(a).count(), a.count_ones() + 1);
        }
    }

    #[test]
    fn full_and_first() {
        assert_eq!(Bits::full(3), bits(0b111));
        assert_eq!(Bits::full(70).count(), 70);
        assert_eq!(bits(0b1000).first(), Some(3));
        assert_eq!(Bits::empty().first(), None);
    }
}
