//! A minimal Protocol Buffers writer: what the pprof exporter needs
//! (varints, length-delimited fields, packed repeated varints) and nothing
//! more. Fields are written in the order the caller gives, so output is as
//! deterministic as its input.
//!
//! Wire format (protobuf.dev/programming-guides/encoding): a field is a key
//! `(number << 3) | wire_type` as a varint, then its value: wire type 0, a
//! varint; wire type 2, a varint length and that many bytes (strings,
//! nested messages, packed repeated scalars).

/// Wire type of varint fields (int64, uint64, bool).
const VARINT: u64 = 0;
/// Wire type of length-delimited fields (string, bytes, messages, packed).
const LEN: u64 = 2;

/// A message being written.
#[derive(Default, Debug)]
pub struct Message {
    buf: Vec<u8>,
}

/// Append `v` as a base-128 varint (7 bits a byte, low bits first, high
/// bit set on every byte but the last).
pub fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

impl Message {
    pub fn new() -> Message {
        Message::default()
    }

    fn key(&mut self, field: u32, wire: u64) {
        put_varint(&mut self.buf, ((field as u64) << 3) | wire);
    }

    /// A varint field (uint64, and int64 of non-negative values). Zero is
    /// proto3's default and is left out, as protobuf encoders do.
    pub fn uint(&mut self, field: u32, v: u64) -> &mut Self {
        if v != 0 {
            self.key(field, VARINT);
            put_varint(&mut self.buf, v);
        }
        self
    }

    /// An int64 field: negative values take ten bytes (two's complement).
    pub fn int(&mut self, field: u32, v: i64) -> &mut Self {
        self.uint(field, v as u64)
    }

    pub fn bool(&mut self, field: u32, v: bool) -> &mut Self {
        self.uint(field, v as u64)
    }

    /// A length-delimited field, written even when empty (repeated strings
    /// such as pprof's string table must keep their empty first entry).
    pub fn bytes(&mut self, field: u32, v: &[u8]) -> &mut Self {
        self.key(field, LEN);
        put_varint(&mut self.buf, v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }

    pub fn string(&mut self, field: u32, v: &str) -> &mut Self {
        self.bytes(field, v.as_bytes())
    }

    /// A nested message.
    pub fn message(&mut self, field: u32, m: &Message) -> &mut Self {
        self.bytes(field, &m.buf)
    }

    /// A packed repeated varint field (proto3's default for repeated
    /// scalars); nothing when empty.
    pub fn packed(&mut self, field: u32, vs: impl IntoIterator<Item = u64>) -> &mut Self {
        let mut body = Vec::new();
        for v in vs {
            put_varint(&mut body, v);
        }
        if !body.is_empty() {
            self.bytes(field, &body);
        }
        self
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
pub mod decode {
    //! A small decoder for the tests: (field, value) pairs of one message.

    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Value {
        Varint(u64),
        Bytes(Vec<u8>),
    }

    pub fn varint(b: &[u8], at: &mut usize) -> u64 {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let byte = b[*at];
            *at += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte < 0x80 {
                return v;
            }
            shift += 7;
            assert!(shift < 70, "varint too long");
        }
    }

    pub fn fields(b: &[u8]) -> Vec<(u32, Value)> {
        let mut at = 0;
        let mut out = Vec::new();
        while at < b.len() {
            let key = varint(b, &mut at);
            let field = (key >> 3) as u32;
            match key & 7 {
                0 => out.push((field, Value::Varint(varint(b, &mut at)))),
                2 => {
                    let n = varint(b, &mut at) as usize;
                    out.push((field, Value::Bytes(b[at..at + n].to_vec())));
                    at += n;
                }
                w => panic!("unexpected wire type {w}"),
            }
        }
        out
    }

    pub fn packed(b: &[u8]) -> Vec<u64> {
        let mut at = 0;
        let mut out = Vec::new();
        while at < b.len() {
            out.push(varint(b, &mut at));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::decode::{fields, packed, Value};
    use super::*;

    #[test]
    fn varints_match_the_specification() {
        // protobuf.dev's examples: 1 → 01, 150 → 96 01.
        let mut b = Vec::new();
        put_varint(&mut b, 1);
        assert_eq!(b, [0x01]);
        b.clear();
        put_varint(&mut b, 150);
        assert_eq!(b, [0x96, 0x01]);
        b.clear();
        put_varint(&mut b, u64::MAX);
        assert_eq!(b.len(), 10);
        assert_eq!(b[9], 0x01);
        let mut at = 0;
        assert_eq!(decode::varint(&b, &mut at), u64::MAX);
    }

    #[test]
    fn known_bytes_of_a_small_message() {
        // protobuf.dev: field 1 = 150 is 08 96 01; field 2 = "testing" is
        // 12 07 74 65 73 74 69 6e 67.
        let mut m = Message::new();
        m.uint(1, 150).string(2, "testing");
        assert_eq!(
            m.as_bytes(),
            [0x08, 0x96, 0x01, 0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']
        );
        // Packed repeated field 4 = [3, 270, 86942]: 22 06 03 8E 02 9E A7 05.
        let mut m = Message::new();
        m.packed(4, [3, 270, 86942]);
        assert_eq!(
            m.as_bytes(),
            [0x22, 0x06, 0x03, 0x8e, 0x02, 0x9e, 0xa7, 0x05]
        );
    }

    #[test]
    fn nested_messages_round_trip_and_zero_is_left_out() {
        let mut inner = Message::new();
        inner.uint(1, 7).uint(2, 0).int(3, -2).string(4, "");
        let mut outer = Message::new();
        outer.message(5, &inner).packed(6, []).bool(7, true);
        let f = fields(outer.as_bytes());
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[1], (7, Value::Varint(1)));
        let Value::Bytes(b) = &f[0].1 else {
            panic!("{f:?}")
        };
        assert_eq!(f[0].0, 5);
        let g = fields(b);
        assert_eq!(
            g,
            vec![
                (1, Value::Varint(7)),
                (3, Value::Varint(-2i64 as u64)),
                (4, Value::Bytes(vec![])),
            ]
        );
        assert_eq!(packed(&[0x03, 0x8e, 0x02]), [3, 270]);
    }
}
