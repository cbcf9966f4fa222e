//! Products of powers modulo a big modulus, cheaper than one `pow_mod` per factor:
//! - a fixed-base table, for one base `h` raised to many short exponents (the blinding factor
//!   `h_s^α` of [`SecretKey::encrypt_many`](crate::SecretKey::encrypt_many)): about `|α| / w`
//!   multiplications per power and no squaring;
//! - Straus's simultaneous multi-exponentiation with sliding windows, for `Π c_i^(v_i)` (the
//!   server's select): one chain of squarings shared by every base, each base contributing one
//!   multiplication per window of its exponent, from a small table of its odd powers that
//!   [`PublicKey::select_blocks`](crate::PublicKey::select_blocks) builds once and reuses for every
//!   chunk column.
//!
//! Every value here is a non-negative residue below the modulus and every reduction is `%` of a
//! non-negative number, so results are the canonical residues, the very integers a chain of
//! `pow_mod` calls gives.

use rug::Integer;

use crate::math;

/// `acc = acc · x mod modulus`.
fn mul_mod(acc: &mut Integer, x: &Integer, modulus: &Integer) {
    *acc *= x;
    *acc %= modulus;
}

/// `acc = acc² mod modulus`.
fn square_mod(acc: &mut Integer, modulus: &Integer) {
    acc.square_mut();
    *acc %= modulus;
}

/// The `width` bits of `x` starting at bit `start` (least significant first), as a number.
fn bits_at(x: &Integer, start: u32, width: u32) -> usize {
    (0..width).rev().fold(0usize, |d, k| (d << 1) | usize::from(x.get_bit(start + k)))
}

/// Bytes taken by one residue below `modulus` (the limbs GMP allocates for it).
pub(crate) fn entry_bytes(modulus: &Integer) -> usize {
    math::byte_len(modulus).next_multiple_of(8)
}

/// Powers of one fixed base `h` modulo a fixed modulus: row `i` holds `h^(j · 2^(w·i))` for
/// `j = 1 .. 2^w - 1`. An exponent below `2^(w · rows)` is cut into `w`-bit digits and its power
/// is the product of one entry per non-zero digit.
pub(crate) struct FixedBase {
    width: u32,
    rows: Vec<Vec<Integer>>,
}

impl FixedBase {
    /// The smallest window width considered; below it the table saves too little.
    pub(crate) const MIN_WIDTH: u32 = 4;
    /// The largest window width considered (255 entries per row).
    pub(crate) const MAX_WIDTH: u32 = 8;

    /// The number of residues the table holds for exponents of `exp_bits` bits.
    pub(crate) fn entries(exp_bits: u32, width: u32) -> usize {
        exp_bits.div_ceil(width) as usize * ((1usize << width) - 1)
    }

    /// The widest window whose table for `exp_bits`-bit exponents fits in `budget` bytes with
    /// residues of `entry_bytes` bytes; `MIN_WIDTH` if none does.
    pub(crate) fn width_for(exp_bits: u32, entry_bytes: usize, budget: usize) -> u32 {
        (Self::MIN_WIDTH..=Self::MAX_WIDTH)
            .rev()
            .find(|&w| Self::entries(exp_bits, w) * entry_bytes <= budget)
            .unwrap_or(Self::MIN_WIDTH)
    }

    /// The table of `h` for exponents of up to `exp_bits` bits: `entries` multiplications (each
    /// row's last product is the next row's base, so no squaring at all).
    pub(crate) fn new(h: &Integer, exp_bits: u32, width: u32, modulus: &Integer) -> Self {
        let rows_wanted = exp_bits.div_ceil(width) as usize;
        let per_row = (1usize << width) - 1;
        let mut rows = Vec::with_capacity(rows_wanted);
        let mut base = Integer::from(h % modulus);
        for _ in 0..rows_wanted {
            let mut row = Vec::with_capacity(per_row);
            let mut power = base.clone();
            for _ in 0..per_row {
                let mut next = Integer::from(&power * &base);
                next %= modulus;
                // A product's allocation is twice a residue's: give the spare limbs back.
                power.shrink_to_fit();
                row.push(std::mem::replace(&mut power, next));
            }
            // `power` is now base^(2^width), the next row's base.
            base = power;
            rows.push(row);
        }
        Self { width, rows }
    }

    /// The largest exponent size, in bits, the table covers.
    pub(crate) fn exp_bits(&self) -> u32 {
        self.width * self.rows.len() as u32
    }

    /// `h^alpha mod modulus`, for `0 <= alpha < 2^exp_bits()`: one multiplication per non-zero
    /// digit but the first.
    pub(crate) fn pow(&self, alpha: &Integer, modulus: &Integer) -> Integer {
        debug_assert!(*alpha >= 0 && alpha.significant_bits() <= self.exp_bits());
        let mut acc: Option<Integer> = None;
        for (i, row) in self.rows.iter().enumerate() {
            let digit = bits_at(alpha, i as u32 * self.width, self.width);
            if digit == 0 {
                continue;
            }
            let entry = &row[digit - 1];
            match acc.as_mut() {
                None => acc = Some(entry.clone()),
                Some(acc) => mul_mod(acc, entry, modulus),
            }
        }
        acc.unwrap_or_else(|| Integer::from(1))
    }

    /// The table's size in bytes (the residues' allocations).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.rows.iter().flatten().map(|x| x.capacity().div_ceil(8)).sum()
    }

    /// Overwrites every entry (the powers of a secret base).
    pub(crate) fn wipe(&mut self) {
        self.rows.iter_mut().flatten().for_each(math::wipe);
    }
}

/// One base's table for sliding windows of `width` bits: `c, c^3, c^5, …, c^(2^width - 1)`.
pub(crate) struct OddPowers {
    width: u32,
    pows: Vec<Integer>,
}

/// The largest sliding-window width for Straus's method (2,048 odd powers per base). A
/// select's tables serve every chunk column, so wide windows pay: 16 bases over 11 columns of
/// 12,288-bit exponents choose 11 (`docs/design.md`, "Damgård–Jurik").
const MAX_STRAUS_WIDTH: u32 = 12;

impl OddPowers {
    /// The window width that minimizes the work for one base whose table serves `uses`
    /// exponents of up to `exp_bits` bits: building costs `2^(w-1)` multiplications once, and
    /// each exponent about `exp_bits / (w + 1)`. The table is kept within `budget` bytes.
    pub(crate) fn width_for(exp_bits: u32, uses: usize, entry_bytes: usize, budget: usize) -> u32 {
        let cost = |w: u32| {
            (1u64 << (w - 1)) as f64 / uses.max(1) as f64 + f64::from(exp_bits) / f64::from(w + 1)
        };
        (1..=MAX_STRAUS_WIDTH)
            .filter(|&w| w == 1 || (1usize << (w - 1)) * entry_bytes <= budget)
            .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))
            .unwrap_or(1)
    }

    /// The odd powers of `c` modulo `modulus`: one squaring and `2^(width-1) - 1` multiplications.
    pub(crate) fn new(c: &Integer, width: u32, modulus: &Integer) -> Self {
        let count = 1usize << (width - 1);
        let mut pows = Vec::with_capacity(count);
        pows.push(Integer::from(c % modulus));
        if count > 1 {
            let mut square = pows[0].clone();
            square_mod(&mut square, modulus);
            for k in 1..count {
                let mut next = Integer::from(&pows[k - 1] * &square);
                next %= modulus;
                next.shrink_to_fit();
                pows.push(next);
            }
        }
        Self { width, pows }
    }
}

/// One multiplication of Straus's method: after the shared accumulator has been squared down to
/// bit `pos`, multiply it by `c_base^(2·index + 1)`.
#[derive(Clone, Copy)]
struct Step {
    pos: u32,
    base: u32,
    index: u32,
}

/// Left-to-right sliding-window digits of `v > 0`: each maximal window of at most `width` bits
/// that starts and ends with a 1 becomes one step at its lowest bit.
fn recode(v: &Integer, width: u32, base: u32, out: &mut Vec<Step>) {
    let mut top = i64::from(v.significant_bits()) - 1;
    while top >= 0 {
        if !v.get_bit(top as u32) {
            top -= 1;
            continue;
        }
        let mut low = (top - i64::from(width) + 1).max(0);
        while !v.get_bit(low as u32) {
            low += 1;
        }
        let digit = bits_at(v, low as u32, (top - low + 1) as u32);
        out.push(Step { pos: low as u32, base, index: (digit >> 1) as u32 });
        top = low - 1;
    }
}

/// `Π c_i^(v_i) mod modulus` over `(table of c_i, v_i)` pairs, by Straus's method: one squaring
/// per bit of the longest exponent, shared by all bases, and one multiplication per window.
/// A pair with `v_i = 0` costs nothing and may come without a table (`None`).
pub(crate) fn multi_pow(terms: &[(Option<&OddPowers>, &Integer)], modulus: &Integer) -> Integer {
    let mut steps = Vec::new();
    for (base, (table, v)) in terms.iter().enumerate() {
        if **v == 0 {
            continue;
        }
        let table = table.expect("a base with a non-zero exponent has its table");
        recode(v, table.width, base as u32, &mut steps);
    }
    // Highest bit first; the order among steps at one bit does not change the product.
    steps.sort_unstable_by_key(|s| std::cmp::Reverse(s.pos));
    let Some(top) = steps.first().map(|s| s.pos) else {
        return Integer::from(1);
    };
    let mut acc: Option<Integer> = None;
    let mut next = steps.iter().peekable();
    for pos in (0..=top).rev() {
        if let Some(acc) = acc.as_mut() {
            square_mod(acc, modulus);
        }
        while let Some(step) = next.next_if(|s| s.pos == pos) {
            let table = terms[step.base as usize].0.expect("checked above");
            let factor = &table.pows[step.index as usize];
            match acc.as_mut() {
                None => acc = Some(factor.clone()),
                Some(acc) => mul_mod(acc, factor, modulus),
            }
        }
    }
    acc.expect("at least one step")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngCore, SeedableRng};
    use rand_chacha::ChaCha20Rng;
    use rug::integer::Order;

    fn random(rng: &mut ChaCha20Rng, bytes: usize) -> Integer {
        let mut buf = vec![0u8; bytes];
        rng.fill_bytes(&mut buf);
        Integer::from_digits(&buf, Order::Msf)
    }

    /// An odd modulus of about 700 bits (the methods never need it prime).
    fn modulus(rng: &mut ChaCha20Rng) -> Integer {
        random(rng, 88) | Integer::from(1)
    }

    #[test]
    fn fixed_base_matches_pow_mod() {
        let mut rng = ChaCha20Rng::seed_from_u64(31);
        let m = modulus(&mut rng);
        let h = random(&mut rng, 100) % &m;
        for width in FixedBase::MIN_WIDTH..=FixedBase::MAX_WIDTH {
            let table = FixedBase::new(&h, 61, width, &m);
            assert!(table.exp_bits() >= 61);
            let mut alphas =
                vec![Integer::new(), Integer::from(1), (Integer::from(1) << 61) - 1u32];
            alphas.extend((0..20).map(|_| random(&mut rng, 8) >> 3u32));
            for a in &alphas {
                let want = h.clone().pow_mod(a, &m).unwrap();
                assert_eq!(table.pow(a, &m), want, "width {width}, alpha {a}");
            }
        }
    }

    #[test]
    fn fixed_base_width_respects_the_budget() {
        // 256-bit exponents, residues of 256 bytes: w = 8 needs 32 · 255 · 256 bytes.
        assert_eq!(FixedBase::width_for(256, 256, 32 * 255 * 256), 8);
        assert_eq!(FixedBase::width_for(256, 256, 32 * 255 * 256 - 1), 7);
        assert_eq!(FixedBase::width_for(256, 1 << 20, 1), FixedBase::MIN_WIDTH);
    }

    #[test]
    fn straus_matches_the_product_of_powers() {
        let mut rng = ChaCha20Rng::seed_from_u64(32);
        let m = modulus(&mut rng);
        for width in 1..=MAX_STRAUS_WIDTH {
            let bases: Vec<Integer> = (0..5).map(|_| random(&mut rng, 90) % &m).collect();
            let mut exps: Vec<Integer> = (0..5).map(|_| random(&mut rng, 40)).collect();
            exps[1] = Integer::new();
            exps[3] = Integer::from(1);
            let tables: Vec<OddPowers> =
                bases.iter().map(|c| OddPowers::new(c, width, &m)).collect();
            let terms: Vec<(Option<&OddPowers>, &Integer)> =
                tables.iter().map(Some).zip(exps.iter()).collect();
            let mut want = Integer::from(1);
            for (c, v) in bases.iter().zip(&exps) {
                want *= c.clone().pow_mod(v, &m).unwrap();
                want %= &m;
            }
            assert_eq!(multi_pow(&terms, &m), want, "width {width}");
        }
        let zero = Integer::new();
        assert_eq!(multi_pow(&[(None, &zero)], &m), 1);
        assert_eq!(multi_pow(&[], &m), 1);
    }

    #[test]
    fn straus_width_grows_with_reuse() {
        let single = OddPowers::width_for(2048, 1, 384, usize::MAX);
        let shared = OddPowers::width_for(2048, 33, 384, usize::MAX);
        assert!(shared > single, "{shared} vs {single}");
        assert_eq!(OddPowers::width_for(1, 1, 384, usize::MAX), 1);
        assert_eq!(OddPowers::width_for(2048, 33, 384, 384), 1);
        // Onion ORAM's deepest eviction selects (16 bases of 11 columns, 12,288-bit exponents,
        // 1,792-byte residues, a 32 MiB budget shared by the bases) go past the old limit of 8.
        assert_eq!(OddPowers::width_for(12_288, 11, 1792, (32 << 20) / 16), 11);
    }
}
