//! Prometheus' XOR chunks (Gorilla's encoding of float samples, as its TSDB keeps them and a
//! streamed remote-read sends them), decoded into samples.
//!
//! A chunk is the sample count (big-endian `u16`), then a bit stream, most significant bit
//! first: the first timestamp as a zigzag varint and its value's 64 bits; the second
//! timestamp's distance from the first as a varint and its value XORed with the first's;
//! then each timestamp as the change of the distance (a `0` bit for none, else `10`, `110`,
//! `1110` or `1111` followed by 14, 17, 20 or 64 bits, two's complement), and each value as
//! its XOR with the one before: `0` when equal, else `1` and either `0` and the meaningful
//! bits within the last window, or `1`, the leading zeros (5 bits), the meaningful bits' count
//! (6 bits, 0 for 64) and the bits.

use super::proto::Sample;

/// Why a chunk cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkError(pub String);

impl std::fmt::Display for ChunkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "XOR chunk: {}", self.0)
    }
}

struct Bits<'a> {
    bytes: &'a [u8],
    /// The next bit, counted from the first byte's most significant.
    at: usize,
}

impl Bits<'_> {
    fn bit(&mut self) -> Result<bool, ChunkError> {
        let byte = self.bytes.get(self.at / 8).ok_or_else(|| ChunkError("it ends early".into()))?;
        let bit = byte >> (7 - self.at % 8) & 1 == 1;
        self.at += 1;
        Ok(bit)
    }

    fn bits(&mut self, n: u32) -> Result<u64, ChunkError> {
        let mut out = 0u64;
        for _ in 0..n {
            out = out << 1 | u64::from(self.bit()?);
        }
        Ok(out)
    }

    fn uvarint(&mut self) -> Result<u64, ChunkError> {
        let mut out = 0u64;
        for shift in (0..70).step_by(7) {
            let byte = self.bits(8)?;
            if shift == 63 && byte > 1 {
                return Err(ChunkError("a varint overflows".into()));
            }
            out |= (byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(out);
            }
        }
        Err(ChunkError("a varint overflows".into()))
    }

    fn varint(&mut self) -> Result<i64, ChunkError> {
        let u = self.uvarint()?;
        Ok((u >> 1) as i64 ^ -((u & 1) as i64))
    }
}

/// The samples of an XOR chunk, in time order.
pub fn decode(chunk: &[u8]) -> Result<Vec<Sample>, ChunkError> {
    let [hi, lo, rest @ ..] = chunk else { return Err(ChunkError("no sample count".into())) };
    let count = usize::from(u16::from_be_bytes([*hi, *lo]));
    let mut r = Bits { bytes: rest, at: 0 };
    let mut out = Vec::with_capacity(count);
    let (mut t, mut delta, mut v) = (0i64, 0i64, 0u64);
    let (mut leading, mut trailing) = (0u32, 0u32);
    for n in 0..count {
        match n {
            0 => {
                t = r.varint()?;
                v = r.bits(64)?;
            }
            _ => {
                if n == 1 {
                    delta = r.uvarint()? as i64;
                } else {
                    delta += dod(&mut r)?;
                }
                t += delta;
                if r.bit()? {
                    if r.bit()? {
                        leading = r.bits(5)? as u32;
                        let significant = match r.bits(6)? as u32 {
                            0 => 64,
                            s => s,
                        };
                        trailing = 64u32.checked_sub(leading + significant).ok_or_else(|| {
                            ChunkError(format!("sample {n}: {leading} leading and {significant} meaningful bits"))
                        })?;
                    }
                    let significant = 64 - leading - trailing;
                    v ^= r.bits(significant)? << trailing;
                }
            }
        }
        out.push(Sample { timestamp: t, value: f64::from_bits(v) });
    }
    Ok(out)
}

/// A change of the distance between timestamps.
fn dod(r: &mut Bits) -> Result<i64, ChunkError> {
    let mut ones = 0;
    while ones < 4 && r.bit()? {
        ones += 1;
    }
    let size = match ones {
        0 => return Ok(0),
        1 => 14,
        2 => 17,
        3 => 20,
        _ => 64,
    };
    let bits = r.bits(size)?;
    if size == 64 {
        return Ok(bits as i64);
    }
    // Two's complement in `size` bits; the encoder writes up to +2^(size-1).
    Ok(if bits > 1 << (size - 1) { bits as i64 - (1i64 << size) } else { bits as i64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bit writer for chunks built by hand, most significant bit first.
    #[derive(Default)]
    struct Writer {
        bytes: Vec<u8>,
        len: usize,
    }

    impl Writer {
        fn put(&mut self, value: u64, n: u32) {
            for i in (0..n).rev() {
                if self.len.is_multiple_of(8) {
                    self.bytes.push(0);
                }
                if value >> i & 1 == 1 {
                    *self.bytes.last_mut().expect("a byte") |= 1 << (7 - self.len % 8);
                }
                self.len += 1;
            }
        }
    }

    #[test]
    fn a_chunk_written_bit_by_bit_reads_back() {
        let mut w = Writer::default();
        // t0 = 1000 (zigzag 2000, varint d0 0f), v0 = 1.5.
        w.put(0xd0, 8);
        w.put(0x0f, 8);
        w.put(1.5f64.to_bits(), 64);
        // t1 = t0 + 15000 (varint 98 75); v1 = v0: a 0 bit.
        w.put(0x98, 8);
        w.put(0x75, 8);
        w.put(0, 1);
        // t2: the same distance (0); v2 = 2.5: XOR in a new window.
        w.put(0, 1);
        let x = 1.5f64.to_bits() ^ 2.5f64.to_bits();
        let (lead, trail) = (x.leading_zeros(), x.trailing_zeros());
        w.put(0b11, 2);
        w.put(u64::from(lead), 5);
        w.put(u64::from(64 - lead - trail), 6);
        w.put(x >> trail, 64 - lead - trail);
        // t3: 1 ms later than the distance says (10, then 14 bits of 1); v3 = v2.
        w.put(0b10, 2);
        w.put(1, 14);
        w.put(0, 1);
        // t4: 2 ms earlier (10, then -2 in 14 bits); v4 = 1.5: XOR within the last window.
        w.put(0b10, 2);
        w.put((1 << 14) - 2, 14);
        w.put(0b10, 2);
        w.put(x >> trail, 64 - lead - trail);
        let mut chunk = vec![0, 5];
        chunk.extend(w.bytes);
        let got: Vec<(i64, f64)> = decode(&chunk).expect("chunk").iter().map(|s| (s.timestamp, s.value)).collect();
        assert_eq!(got, [(1_000, 1.5), (16_000, 1.5), (31_000, 2.5), (46_001, 2.5), (61_000, 1.5)]);
    }

    #[test]
    fn a_chunk_cut_short_is_an_error_not_a_panic() {
        assert!(decode(&[]).is_err());
        assert!(decode(&[0, 3, 0xd0]).is_err());
        assert_eq!(decode(&[0, 0]).expect("empty"), Vec::new());
    }
}
