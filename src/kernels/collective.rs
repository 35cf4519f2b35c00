//! Collectives, described: element types, reduction operators, what one collective call does
//! (with NCCL's buffer-size rules), and the reduction arithmetic the host backend's model of a
//! communicator runs.
//!
//! The arithmetic is a contract like the built-ins' (`host.rs`): ranks' contributions are
//! combined in rank order, `acc = op(acc, x[rank])` from rank 0 up, one IEEE operation per step.
//! f16 and bf16 are widened to f32 for each step and rounded back (to nearest, ties to even) after
//! it, as a GPU doing half arithmetic would. `Avg` is the rank-order sum divided by the number of
//! ranks once at the end (floats: an IEEE division, rounded to the type; i32: truncating integer
//! division, as NCCL's integer average does). i32 sums and products wrap. `Min`/`Max` keep the
//! accumulator unless the new value compares strictly less/greater, so a NaN met first stays.
//! NCCL on a GPU reduces in its own ring/tree order, so its float results may differ in the last
//! bits from this model's; on one rank both are the input itself.

/// Element type of a collective (NCCL's names in comments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// ncclFloat32
    F32,
    /// ncclFloat16
    F16,
    /// ncclBfloat16
    BF16,
    /// ncclInt32
    I32,
}

impl DType {
    pub fn size(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
        }
    }
}

/// Reduction operator (ncclSum, ncclProd, ncclMin, ncclMax, ncclAvg).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
}

/// What one collective call does. Counts are in elements, with NCCL's meaning (see
/// [`Collective::send_elems`] and [`Collective::recv_elems`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    AllReduce(ReduceOp),
    /// Every rank receives the root's `count` elements.
    Broadcast {
        root: u32,
    },
    /// The root receives the reduction; other ranks' receive buffers are untouched.
    Reduce {
        op: ReduceOp,
        root: u32,
    },
    /// Every rank sends `count` elements and receives `count × nranks`, rank 0's first.
    AllGather,
    /// Every rank sends `count × nranks` elements and receives the reduction of its `count`-sized
    /// slice (rank r gets slice r).
    ReduceScatter(ReduceOp),
    /// `count` elements to `peer`; matched in order with the peer's `Recv` from this rank.
    Send {
        peer: u32,
    },
    /// `count` elements from `peer`.
    Recv {
        peer: u32,
    },
}

impl CollectiveKind {
    pub fn name(&self) -> String {
        match self {
            CollectiveKind::AllReduce(op) => format!("all-reduce({})", op.name()),
            CollectiveKind::Broadcast { root } => format!("broadcast(root {root})"),
            CollectiveKind::Reduce { op, root } => format!("reduce({}, root {root})", op.name()),
            CollectiveKind::AllGather => "all-gather".into(),
            CollectiveKind::ReduceScatter(op) => format!("reduce-scatter({})", op.name()),
            CollectiveKind::Send { peer } => format!("send(to {peer})"),
            CollectiveKind::Recv { peer } => format!("recv(from {peer})"),
        }
    }

    /// Point-to-point (send/receive) rather than a collective every rank joins.
    pub fn is_p2p(&self) -> bool {
        matches!(
            self,
            CollectiveKind::Send { .. } | CollectiveKind::Recv { .. }
        )
    }
}

/// One collective call on device buffers: `send` and `recv` are device addresses (equal for in
/// place). A `Send` has no receive buffer and a `Recv` no send buffer (0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Collective {
    pub kind: CollectiveKind,
    pub dtype: DType,
    pub count: u64,
    pub send: u64,
    pub recv: u64,
    /// The graph node that issued the call (`NO_NODE`: none); messages about a call that
    /// differs between ranks name it.
    pub node: u32,
}

/// `Collective::node` of a call no graph node issued.
pub(crate) const NO_NODE: u32 = u32::MAX;

impl Collective {
    /// " (node 3)" for a call a graph node issued, "" otherwise.
    pub fn node_suffix(&self) -> String {
        if self.node == NO_NODE {
            String::new()
        } else {
            format!(" (node {})", self.node)
        }
    }

    /// Elements read from `send` on a rank of a communicator of `nranks`.
    pub fn send_elems(&self, nranks: u32) -> u64 {
        match self.kind {
            CollectiveKind::ReduceScatter(_) => self.count * nranks as u64,
            CollectiveKind::Recv { .. } => 0,
            _ => self.count,
        }
    }

    /// Elements written to `recv` (on the root, for `Reduce`).
    pub fn recv_elems(&self, nranks: u32) -> u64 {
        match self.kind {
            CollectiveKind::AllGather => self.count * nranks as u64,
            CollectiveKind::Send { .. } => 0,
            _ => self.count,
        }
    }

    /// A rank, root or peer out of range for `nranks`, as a message.
    pub fn check_ranks(&self, rank: u32, nranks: u32) -> Result<(), String> {
        let (what, r) = match self.kind {
            CollectiveKind::Broadcast { root } | CollectiveKind::Reduce { root, .. } => {
                ("root", root)
            }
            CollectiveKind::Send { peer } | CollectiveKind::Recv { peer } => ("peer", peer),
            _ => return Ok(()),
        };
        if r >= nranks {
            return Err(format!(
                "{}: {what} {r} is not a rank of a communicator of {nranks}",
                self.kind.name()
            ));
        }
        if what == "peer" && r == rank {
            return Err(format!(
                "{}: rank {rank} cannot send to or receive from itself",
                self.kind.name()
            ));
        }
        Ok(())
    }
}

// --- the arithmetic ---

/// f32 → IEEE binary16, rounded to nearest, ties to even (NaN stays NaN, overflow is ±inf).
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Subnormal (or zero) in f16: shift the full significand right and round.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut h = m >> shift;
        if rest > half || (rest == half && h & 1 == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1; // may carry into the exponent, up to inf: still correct
    }
    sign | h as u16
}

/// IEEE binary16 → f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: value = man × 2^-24.
            let v = man as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, _) => sign | 0x7fc0_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// f32 → bfloat16, rounded to nearest, ties to even (NaN stays NaN).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Widening and rounding functions of a 16-bit float type.
type HalfConversions = (fn(u16) -> f32, fn(f32) -> u16);

fn half_conversions(dtype: DType) -> HalfConversions {
    if dtype == DType::F16 {
        (f16_to_f32, f32_to_f16)
    } else {
        (bf16_to_f32, f32_to_bf16)
    }
}

fn combine_f32(op: ReduceOp, a: f32, b: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::Min => {
            if b < a {
                b
            } else {
                a
            }
        }
        ReduceOp::Max => {
            if b > a {
                b
            } else {
                a
            }
        }
    }
}

fn combine_i32(op: ReduceOp, a: i32, b: i32) -> i32 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
        ReduceOp::Prod => a.wrapping_mul(b),
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
    }
}

/// `acc[i] = op(acc[i], x[i])` for every element (byte slices of `dtype`, equal lengths).
pub fn combine(op: ReduceOp, dtype: DType, acc: &mut [u8], x: &[u8]) {
    debug_assert_eq!(acc.len(), x.len());
    match dtype {
        DType::F32 => {
            for (a, b) in acc.chunks_exact_mut(4).zip(x.chunks_exact(4)) {
                let r = combine_f32(
                    op,
                    f32::from_ne_bytes(a.try_into().unwrap()),
                    f32::from_ne_bytes(b.try_into().unwrap()),
                );
                a.copy_from_slice(&r.to_ne_bytes());
            }
        }
        DType::I32 => {
            for (a, b) in acc.chunks_exact_mut(4).zip(x.chunks_exact(4)) {
                let r = combine_i32(
                    op,
                    i32::from_ne_bytes(a.try_into().unwrap()),
                    i32::from_ne_bytes(b.try_into().unwrap()),
                );
                a.copy_from_slice(&r.to_ne_bytes());
            }
        }
        DType::F16 | DType::BF16 => {
            let (widen, narrow) = half_conversions(dtype);
            for (a, b) in acc.chunks_exact_mut(2).zip(x.chunks_exact(2)) {
                let r = combine_f32(
                    op,
                    widen(u16::from_ne_bytes(a.try_into().unwrap())),
                    widen(u16::from_ne_bytes(b.try_into().unwrap())),
                );
                a.copy_from_slice(&narrow(r).to_ne_bytes());
            }
        }
    }
}

/// The end of an average: every element divided by `nranks` (a no-op for other operators).
pub fn finish(op: ReduceOp, dtype: DType, acc: &mut [u8], nranks: u32) {
    if op != ReduceOp::Avg {
        return;
    }
    match dtype {
        DType::F32 => {
            for a in acc.chunks_exact_mut(4) {
                let v = f32::from_ne_bytes((&*a).try_into().unwrap()) / nranks as f32;
                a.copy_from_slice(&v.to_ne_bytes());
            }
        }
        DType::I32 => {
            for a in acc.chunks_exact_mut(4) {
                let v = i32::from_ne_bytes((&*a).try_into().unwrap()) / nranks as i32;
                a.copy_from_slice(&v.to_ne_bytes());
            }
        }
        DType::F16 | DType::BF16 => {
            let (widen, narrow) = half_conversions(dtype);
            for a in acc.chunks_exact_mut(2) {
                let v = widen(u16::from_ne_bytes((&*a).try_into().unwrap())) / nranks as f32;
                a.copy_from_slice(&narrow(v).to_ne_bytes());
            }
        }
    }
}

/// The reduction of `parts` (one byte slice per rank, in rank order) under the contract above.
pub fn reduce(op: ReduceOp, dtype: DType, parts: &[&[u8]]) -> Vec<u8> {
    let mut acc = parts[0].to_vec();
    for x in &parts[1..] {
        combine(op, dtype, &mut acc, x);
    }
    finish(op, dtype, &mut acc, parts.len() as u32);
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_value_and_rounds_to_nearest_even() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f16_to_f32(f32_to_f16(f)).is_nan());
            } else {
                assert_eq!(f32_to_f16(f), h, "value {h:#x} ({f})");
            }
        }
        // 1 + 2^-11 is halfway between 1 and the next f16 (1 + 2^-10): ties to even → 1.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        // Slightly above the halfway point rounds up.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 0x3c01);
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "overflow rounds to inf");
        assert_eq!(
            f32_to_f16(2f32.powi(-25)),
            0,
            "halfway to the least subnormal: even"
        );
        assert_eq!(f32_to_f16(2f32.powi(-24)), 1);
    }

    #[test]
    fn bf16_round_trips_and_rounds_to_nearest_even() {
        for h in (0..=u16::MAX).step_by(7) {
            let f = bf16_to_f32(h);
            if !f.is_nan() {
                assert_eq!(f32_to_bf16(f), h);
            }
        }
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    }

    #[test]
    fn reduce_is_in_rank_order_and_avg_divides_once() {
        let v = |x: &[f32]| x.iter().flat_map(|f| f.to_ne_bytes()).collect::<Vec<u8>>();
        // (1e8 + -1e8) + 1 = 1, while 1e8 + (-1e8 + 1) = 0 in f32: the order shows.
        let parts = [v(&[1e8]), v(&[-1e8]), v(&[1.0])];
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        assert_eq!(reduce(ReduceOp::Sum, DType::F32, &refs), v(&[1.0]));
        let avg = reduce(ReduceOp::Avg, DType::F32, &refs);
        assert_eq!(avg, v(&[1.0 / 3.0]));
        let i = |x: &[i32]| x.iter().flat_map(|f| f.to_ne_bytes()).collect::<Vec<u8>>();
        let parts = [i(&[7, i32::MAX]), i(&[-2, 1])];
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        assert_eq!(
            reduce(ReduceOp::Avg, DType::I32, &refs),
            i(&[2, i32::MIN / 2])
        );
        assert_eq!(reduce(ReduceOp::Min, DType::I32, &refs), i(&[-2, 1]));
    }
}
