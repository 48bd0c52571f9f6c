//! Python line numbers from a code object's line table, as CPython itself
//! computes them (`PyCode_Addr2Line`), per version:
//!
//! - 3.9 `co_lnotab`: (byte-offset increment, signed line increment) pairs;
//! - 3.10 `co_linetable`: (byte-range length, signed line delta) pairs, a
//!   delta of -128 meaning "no line";
//! - 3.11–3.13 `co_linetable`, the location table: entries of 1–8 code
//!   units, each starting with a byte `1CCCCLLL` (code, length − 1), the
//!   line as a delta in one of the entry forms, code 15 meaning "no line".
//!
//! The agent sends each code object's table once (with its name) and, per
//! sampled frame, the index of the instruction the frame was executing;
//! [`line_of`] turns the two into the line the frame was on.

/// A code object's line table, as the agent read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineTable {
    /// CPython's minor version (3.`minor`).
    pub minor: u8,
    pub firstlineno: i32,
    pub bytes: Vec<u8>,
    /// The agent sent only the start of a longer table: instructions past
    /// its end have no line.
    pub cut: bool,
}

/// The line of the instruction at `index` (in code units; -1: the frame has
/// not started, which CPython reports as the function's first line), or
/// `None` when the table does not give one (no line for that instruction,
/// past the table's end, an unknown version).
pub fn line_of(t: &LineTable, index: i64) -> Option<u32> {
    if index < 0 {
        return positive(t.firstlineno);
    }
    match t.minor {
        9 => lnotab(t, index * 2),
        10 => linetable_310(t, index * 2),
        11..=13 => locations(t, index),
        _ => None,
    }
    .and_then(positive)
}

fn positive(line: i32) -> Option<u32> {
    (line > 0).then_some(line as u32)
}

/// 3.9: `PyCode_Addr2Line` over `co_lnotab`, `addr` in bytes.
fn lnotab(t: &LineTable, addr: i64) -> Option<i32> {
    let mut line = t.firstlineno;
    let mut at: i64 = 0;
    let mut pairs = t.bytes.chunks_exact(2);
    for p in pairs.by_ref() {
        at += p[0] as i64;
        if at > addr {
            return Some(line);
        }
        line += p[1] as i8 as i32;
    }
    // Past the last increment: the last line, unless the table was cut.
    (!t.cut).then_some(line)
}

/// 3.10: address ranges of `co_linetable`, `addr` in bytes.
fn linetable_310(t: &LineTable, addr: i64) -> Option<i32> {
    let mut line = t.firstlineno;
    let mut end: i64 = 0;
    for p in t.bytes.chunks_exact(2) {
        let start = end;
        end += p[0] as i64;
        let delta = p[1] as i8;
        let this = if delta == -128 {
            None
        } else {
            line += delta as i32;
            Some(line)
        };
        if start <= addr && addr < end {
            return this;
        }
    }
    None
}

/// 3.11+: the location table, `index` in code units.
fn locations(t: &LineTable, index: i64) -> Option<i32> {
    let b = &t.bytes;
    let mut line = t.firstlineno;
    let mut end: i64 = 0;
    let mut i = 0;
    while i < b.len() {
        let first = b[i];
        if first & 0x80 == 0 {
            return None; // not at an entry's start: a malformed table
        }
        let code = (first >> 3) & 15;
        let start = end;
        end += (first & 7) as i64 + 1;
        let delta = match code {
            13 | 14 => signed_varint(b, i + 1)?,
            10..=12 => (code - 10) as i32,
            _ => 0,
        };
        line += delta;
        if start <= index && index < end {
            return (code != 15).then_some(line);
        }
        i += 1;
        while i < b.len() && b[i] & 0x80 == 0 {
            i += 1;
        }
    }
    None
}

/// CPython's 6-bit varint (bit 6: more follows), at `b[i]`.
fn varint(b: &[u8], mut i: usize) -> Option<u32> {
    let mut read = *b.get(i)?;
    let mut val = (read & 63) as u32;
    let mut shift = 0;
    while read & 64 != 0 {
        i += 1;
        read = *b.get(i)?;
        shift += 6;
        if shift > 30 {
            return None;
        }
        val |= ((read & 63) as u32) << shift;
    }
    Some(val)
}

fn signed_varint(b: &[u8], i: usize) -> Option<i32> {
    let u = varint(b, i)?;
    Some(if u & 1 != 0 {
        -((u >> 1) as i32)
    } else {
        (u >> 1) as i32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The same function compiled by each CPython; the lines are what
    /// CPython says of each instruction (`co_lines()`, 3.9:
    /// `dis.findlinestarts`), printed by that interpreter:
    ///
    /// ```python
    /// def f(n):            # line 2
    ///     a = 0
    ///     for i in range(n):
    ///         if i % 3:
    ///             a += i
    ///         else:
    ///             a -= 1
    ///
    ///     return [x
    ///             for x in range(a)]
    /// ```
    const CASES: &[(u8, &str, &[Option<u32>])] = &[
        (
            9,
            "000104010c0108010a020a02060106ff",
            &[
                Some(3), Some(3), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(5),
                Some(5), Some(5), Some(5), Some(6), Some(6), Some(6), Some(6), Some(6), Some(8),
                Some(8), Some(8), Some(8), Some(8), Some(10), Some(10), Some(10), Some(11),
                Some(11), Some(11), Some(10), Some(10), Some(10),
            ],
        ),
        (
            10,
            "04010c0108010a010a020602060106ff",
            &[
                Some(3), Some(3), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(5),
                Some(5), Some(5), Some(5), Some(6), Some(6), Some(6), Some(6), Some(6), Some(8),
                Some(8), Some(8), Some(8), Some(8), Some(10), Some(10), Some(10), Some(11),
                Some(11), Some(11), Some(10), Some(10), Some(10),
            ],
        ),
        (
            11,
            "8000d808098041dd0d12903189588c58f000040513f0000405138801d80b0c88718935f000030913d80c0d9011894688418841e00c0d9011894688418841f004010c1ff000010c1fdd151a983191589458f003010c1ff100010c1ff400010c1ff00001051f",
            &[
                Some(2), Some(3), Some(3), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4),
                Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4),
                Some(4), Some(4), Some(5), Some(5), Some(5), Some(5), Some(5), Some(6), Some(6),
                Some(6), Some(6), Some(6), Some(6), Some(8), Some(8), Some(8), Some(8), Some(8),
                Some(8), Some(10), Some(10), Some(11), Some(11), Some(11), Some(11), Some(11),
                Some(11), Some(11), Some(11), Some(11), Some(11), Some(11), Some(11), Some(11),
                Some(11), Some(10), Some(10), Some(10), Some(10), Some(10), Some(10), Some(10),
                Some(10), Some(10),
            ],
        ),
        (
            12,
            "8000d808098041dc0d1290318b58f2000405138801d80b0c88718a35d80c0d901189468941e00c0d901189468941f009040513f40e00161b98319358f603010c1fd81011f203000d0ef200010c1ff00001051ff9f200010c1f",
            &[
                Some(2), Some(3), Some(3), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4),
                Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(5),
                Some(5), Some(5), Some(5), Some(5), Some(6), Some(6), Some(6), Some(6), Some(6),
                Some(6), Some(8), Some(8), Some(8), Some(8), Some(8), Some(8), Some(4), Some(11),
                Some(11), Some(11), Some(11), Some(11), Some(11), Some(11), Some(11), Some(11),
                Some(11), Some(10), Some(10), Some(10), Some(10), Some(10), Some(10), Some(10),
                Some(11), Some(10), Some(10), Some(10), Some(10), Some(10), Some(10), Some(10),
                None, None, Some(10), Some(10), Some(10),
            ],
        ),
        (
            13,
            "8000d808098041dc0d1290318e588801d80b0c88718f35d80c0d89468a41e00c0d901189468a41f109000e16f40e00161b98319458f303010c1fd9151d9001f303000d0ed9151df103010c1ff00001051ff9f200010c1f",
            &[
                Some(2), Some(3), Some(3), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4),
                Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(4), Some(5),
                Some(5), Some(5), Some(5), Some(5), Some(5), Some(5), Some(5), Some(5), Some(5),
                Some(6), Some(6), Some(6), Some(6), Some(6), Some(6), Some(8), Some(8), Some(8),
                Some(8), Some(8), Some(8), Some(8), Some(4), Some(4), Some(11), Some(11), Some(11),
                Some(11), Some(11), Some(11), Some(11), Some(11), Some(11), Some(11), Some(11),
                Some(10), Some(10), Some(10), Some(10), Some(11), Some(11), Some(11), Some(10),
                Some(10), Some(10), Some(10), Some(11), Some(11), Some(10), Some(10), Some(10),
                None, None, Some(10), Some(10), Some(10),
            ],
        ),
    ];

    #[test]
    fn every_instruction_gets_cpythons_own_line() {
        for (minor, table, want) in CASES {
            let t = LineTable {
                minor: *minor,
                firstlineno: 2,
                bytes: hex(table),
                cut: false,
            };
            let got: Vec<Option<u32>> = (0..want.len() as i64).map(|i| line_of(&t, i)).collect();
            assert_eq!(&got, want, "3.{minor}");
            // Not started: the first line, as CPython says.
            assert_eq!(line_of(&t, -1), Some(2));
        }
    }

    #[test]
    fn cut_or_unknown_tables_give_no_line() {
        let (_, table, _) = CASES[2];
        let mut t = LineTable {
            minor: 11,
            firstlineno: 2,
            bytes: hex(table)[..6].to_vec(),
            cut: true,
        };
        assert_eq!(line_of(&t, 1), Some(3));
        assert_eq!(line_of(&t, 60), None, "past a cut table");
        t.minor = 14;
        assert_eq!(line_of(&t, 1), None, "a version whose table is not known");
        let t9 = LineTable {
            minor: 9,
            firstlineno: 2,
            bytes: hex(CASES[0].1)[..4].to_vec(),
            cut: true,
        };
        assert_eq!(line_of(&t9, 30), None);
        // A malformed location table (not at an entry's start).
        let bad = LineTable {
            minor: 12,
            firstlineno: 2,
            bytes: vec![0x01, 0x02],
            cut: false,
        };
        assert_eq!(line_of(&bad, 0), None);
    }
}
