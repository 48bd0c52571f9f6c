//! NVTX range names as the collector counts them and the analysis groups
//! them.

/// Group key of a message: runs of digits that stand alone as a token
/// become `N` (`step 12` → `step N`, `epoch=3/iter_40` → `epoch=N/iter_N`),
/// so that one range per step with a counter in its name is one group;
/// digits inside words stay (`conv2d`, `layer1`).
pub fn name_group(name: &str) -> String {
    let b = name.as_bytes();
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let mut j = i;
            while j < b.len()
                && (b[j].is_ascii_digit()
                    || (b[j] == b'.' && j + 1 < b.len() && b[j + 1].is_ascii_digit()))
            {
                j += 1;
            }
            let before_ok = i == 0 || !b[i - 1].is_ascii_alphanumeric();
            let after_ok = j == b.len() || !b[j].is_ascii_alphanumeric();
            if before_ok && after_ok {
                out.push('N');
            } else {
                out.push_str(&name[i..j]);
            }
            i = j;
        } else {
            // Copy one UTF-8 character.
            let ch = name[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}
