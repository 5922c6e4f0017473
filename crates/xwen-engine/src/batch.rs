//! The rows of one forward step. A batch is several sequences, each a span of consecutive rows
//! of the flat activation matrix (its tokens) at its own position — any mix of decode rows
//! (spans of one token) and prefill chunks, like llama.cpp's ubatch or nano-vllm's flat batch.
//!
//! Batch invariance is the rule every block keeps: a row's result depends only on its own
//! sequence's tokens and the span sizes they were fed in, never on what else shares the batch.
//! So a product's float order is chosen per span exactly as if the span ran alone — single-token
//! spans in the one-token (matvec) order, sharing one pass over the weights; a longer span in
//! the order of a product with its own row count — and attention and the recurrent layers run
//! per sequence over its span.

use std::ops::Range;

/// One sequence's part of a batch: rows `start..start + len`, the first at position `pos0`.
/// With `decode_order`, every row is computed in the one-token (decode) order — products with
/// the decode rows, attention's one-token reduction — as if the span's tokens were decoded one
/// by one: a speculative verify then gives exactly plain greedy decode's logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    pub pos0: usize,
    pub decode_order: bool,
}

impl Span {
    pub fn rows(&self) -> Range<usize> {
        self.start..self.start + self.len
    }
}

/// The spans of a batch, back to back from row 0.
#[derive(Clone, Debug)]
pub struct Rows {
    pub spans: Vec<Span>,
    /// Rows in all spans.
    pub n: usize,
}

impl Rows {
    /// One sequence of `n` rows from position `pos0`.
    pub fn single(n: usize, pos0: usize) -> Rows {
        Rows { spans: vec![Span { start: 0, len: n, pos0, decode_order: false }], n }
    }

    /// Spans of the given (length, first position), laid out back to back.
    pub fn from_lens(lens_pos: impl IntoIterator<Item = (usize, usize)>) -> Rows {
        Rows::from_spans(lens_pos.into_iter().map(|(len, pos0)| (len, pos0, false)))
    }

    /// Spans of the given (length, first position, decode order), laid out back to back.
    pub fn from_spans(spans_in: impl IntoIterator<Item = (usize, usize, bool)>) -> Rows {
        let mut spans = Vec::new();
        let mut n = 0;
        for (len, pos0, decode_order) in spans_in {
            spans.push(Span { start: n, len, pos0, decode_order });
            n += len;
        }
        Rows { spans, n }
    }

    /// Whether the batch is one sequence in its own order (every block then runs exactly its
    /// one-sequence path).
    pub fn is_single(&self) -> bool {
        self.spans.len() == 1 && !self.spans[0].decode_order
    }

    /// Each row's position in its sequence, row by row.
    pub fn positions(&self) -> Vec<usize> {
        self.spans.iter().flat_map(|s| (0..s.len).map(move |i| s.pos0 + i)).collect()
    }

    /// The rows computed in the one-token order — single-token spans and every row of a
    /// decode-order span — ascending: they share weight passes.
    pub fn decode_rows(&self) -> Vec<usize> {
        self.spans.iter().filter(|s| s.len == 1 || s.decode_order).flat_map(|s| s.rows()).collect()
    }

    /// Spans of two or more rows in their own order (prefill chunks): each runs its products
    /// alone.
    pub fn multi_row_spans(&self) -> impl Iterator<Item = &Span> {
        self.spans.iter().filter(|s| s.len > 1 && !s.decode_order)
    }
}

/// Rows `rows` of a row-major matrix of `width` columns, gathered into one matrix.
pub fn gather(x: &[f32], width: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * width);
    for &r in rows {
        out.extend_from_slice(&x[r * width..(r + 1) * width]);
    }
    out
}

/// The inverse of [`gather`]: row i of `src` to row `rows[i]` of `dst`.
pub fn scatter(src: &[f32], width: usize, rows: &[usize], dst: &mut [f32]) {
    for (i, &r) in rows.iter().enumerate() {
        dst[r * width..(r + 1) * width].copy_from_slice(&src[i * width..(i + 1) * width]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_lie_back_to_back_and_decode_rows_are_the_single_ones() {
        let r = Rows::from_lens([(1, 7), (5, 0), (1, 3)]);
        assert_eq!(r.n, 7);
        assert_eq!(r.spans[1], Span { start: 1, len: 5, pos0: 0, decode_order: false });
        assert_eq!(r.decode_rows(), vec![0, 6]);
        assert_eq!(r.multi_row_spans().count(), 1);
        let x: Vec<f32> = (0..14).map(|v| v as f32).collect();
        let g = gather(&x, 2, &[0, 6]);
        assert_eq!(g, vec![0.0, 1.0, 12.0, 13.0]);
        let mut y = vec![0.0; 14];
        scatter(&g, 2, &[0, 6], &mut y);
        assert_eq!(&y[12..], &[12.0, 13.0]);
        let d = Rows::from_spans([(3, 4, true), (2, 0, false)]);
        assert_eq!(d.decode_rows(), vec![0, 1, 2]);
        assert_eq!(d.positions(), vec![4, 5, 6, 0, 1]);
        assert_eq!(d.multi_row_spans().count(), 1);
        assert!(!Rows::from_spans([(1, 0, true)]).is_single());
    }
}
