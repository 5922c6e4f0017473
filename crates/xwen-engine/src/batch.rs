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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    pub pos0: usize,
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
        Rows { spans: vec![Span { start: 0, len: n, pos0 }], n }
    }

    /// Spans of the given (length, first position), laid out back to back.
    pub fn from_lens(lens_pos: impl IntoIterator<Item = (usize, usize)>) -> Rows {
        let mut spans = Vec::new();
        let mut n = 0;
        for (len, pos0) in lens_pos {
            spans.push(Span { start: n, len, pos0 });
            n += len;
        }
        Rows { spans, n }
    }

    /// Whether the batch is one sequence (every block then runs exactly its one-sequence path).
    pub fn is_single(&self) -> bool {
        self.spans.len() == 1
    }

    /// The rows of single-token spans (decode rows), ascending: they share weight passes.
    pub fn decode_rows(&self) -> Vec<usize> {
        self.spans.iter().filter(|s| s.len == 1).map(|s| s.start).collect()
    }

    /// Spans of two or more rows (prefill chunks): each runs its products alone.
    pub fn multi_row_spans(&self) -> impl Iterator<Item = &Span> {
        self.spans.iter().filter(|s| s.len > 1)
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
        assert_eq!(r.spans[1], Span { start: 1, len: 5, pos0: 0 });
        assert_eq!(r.decode_rows(), vec![0, 6]);
        assert_eq!(r.multi_row_spans().count(), 1);
        let x: Vec<f32> = (0..14).map(|v| v as f32).collect();
        let g = gather(&x, 2, &[0, 6]);
        assert_eq!(g, vec![0.0, 1.0, 12.0, 13.0]);
        let mut y = vec![0.0; 14];
        scatter(&g, 2, &[0, 6], &mut y);
        assert_eq!(&y[12..], &[12.0, 13.0]);
    }
}
