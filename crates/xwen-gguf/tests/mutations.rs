//! Property test for plain `cargo test`: thousands of deterministic mutations of a valid file
//! (byte flips, truncations, insertions, extreme u64 overwrites) never panic the reader, and
//! whatever it accepts has every tensor range inside the file.

mod common;

use common::{small_model, Rng};
use xwen_gguf::GgufFile;

const CASES: usize = 20_000;

fn mutate(base: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..1 + rng.below(3) {
        match rng.below(5) {
            0 => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            2 => b.truncate(rng.below(b.len() + 1)),
            3 => {
                let i = rng.below(b.len() + 1);
                let n = 1 + rng.below(16);
                let ins: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                b.splice(i..i, ins);
            }
            _ => {
                // Counts, lengths, dims and offsets are u64s: hit them with extremes.
                let extremes = [0, 1, u64::MAX, u64::MAX / 2, 1 << 32, 1 << 62, 255];
                let v = extremes[rng.below(extremes.len())];
                if b.len() >= 8 {
                    let i = rng.below(b.len() - 7);
                    b[i..i + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        if b.is_empty() {
            break;
        }
    }
    b
}

#[test]
fn mutated_files_never_panic() {
    let base = small_model();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut accepted, mut rejected) = (0, 0);
    for case in 0..CASES {
        let m = mutate(&base, &mut rng);
        let len = m.len();
        let result = std::panic::catch_unwind(|| match GgufFile::from_bytes(m) {
            Ok(f) => {
                for t in f.tensors() {
                    assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
                    assert!(f.data_offset() + t.offset + t.n_bytes <= f.file_len());
                }
                for (_, v) in f.metadata() {
                    assert!(!v.type_name().is_empty());
                }
                true
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        });
        match result {
            Ok(true) => accepted += 1,
            Ok(false) => rejected += 1,
            Err(_) => panic!("case {case} ({len} bytes) panicked"),
        }
    }
    eprintln!("{CASES} mutations: {accepted} accepted, {rejected} rejected");
    // Both outcomes must occur, or the mutations are not exercising the reader.
    assert!(
        accepted > 50 && rejected > 50,
        "accepted {accepted}, rejected {rejected}"
    );
}
