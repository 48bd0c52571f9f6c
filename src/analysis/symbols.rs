//! Short labels for long C++ symbols. A demangled name from a framework's
//! kernels runs to thousands of characters
//! (`batch_norm_cpu_backward_contiguous_impl<float>(at::Tensor&, …)::{lambda(long, long)#1}::operator()…`):
//! as a frame label it fills a finding's evidence and widens every
//! folded line. The label elides template arguments (`<…>`), parameter
//! lists (`(…)`) and lambda signatures (`{lambda#1}`), then cuts the
//! middle of what is still longer than [`MAX_LABEL_CHARS`]. The full name
//! stays in the frame's `name` (pprof and speedscope profiles carry it).

use std::borrow::Cow;

/// Longest label of one symbol, in characters.
pub const MAX_LABEL_CHARS: usize = 160;

/// Names shorter than this are left as they are: the elisions only pay
/// for themselves on long names, and short ones read better whole.
const SHORTEN_FROM_CHARS: usize = 80;

/// Whether the bracket at byte `i` of `s` belongs to an operator's name
/// (`operator<`, `operator<<`, `operator<=>`, `operator->`, `operator()`).
fn operator_at(s: &str, i: usize) -> bool {
    let head = &s[..i];
    match s[i..].chars().next() {
        Some('(') => head.ends_with("operator"),
        Some(')') => head.ends_with("operator("),
        _ => {
            let t = head.trim_end_matches(['<', '>', '=', '-']);
            t.ends_with("operator") && i - t.len() <= 2
        }
    }
}

/// `s` with the insides of `open`…`close` pairs replaced by `…`, except
/// where `keep` says so for the opening at that byte.
fn elide(s: &str, open: char, close: char, keep: impl Fn(&str, usize) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        if c == open && (depth > 0 || !keep(s, i)) && !operator_at(s, i) {
            if depth == 0 {
                out.push(open);
            }
            depth += 1;
            continue;
        }
        if c == close && depth > 0 && !operator_at(s, i) {
            depth -= 1;
            if depth == 0 {
                out.push('…');
                out.push(close);
            }
            continue;
        }
        if depth == 0 {
            out.push(c);
        }
    }
    // Unbalanced (a truncated name): keep it whole rather than lose a part.
    if depth > 0 {
        return s.to_string();
    }
    out
}

/// The label of a native symbol: the symbol itself when short.
pub fn short_label(sym: &str) -> Cow<'_, str> {
    if sym.chars().count() < SHORTEN_FROM_CHARS {
        return Cow::Borrowed(sym);
    }
    // `{lambda(long, long)#1}` → `{lambda#1}`.
    let mut s = String::with_capacity(sym.len());
    let mut rest = sym;
    while let Some(i) = rest.find("{lambda(") {
        s.push_str(&rest[..i + "{lambda".len()]);
        let after = &rest[i + "{lambda".len()..];
        match after.find(")#") {
            Some(j) => rest = &after[j + 1..],
            None => {
                rest = after;
                break;
            }
        }
    }
    s.push_str(rest);
    let s = elide(&s, '<', '>', |_, _| false);
    // `(anonymous namespace)` and empty lists stay; argument lists go.
    let s = elide(&s, '(', ')', |s, i| {
        s[i..].starts_with("(anonymous namespace)") || s[i..].starts_with("()")
    });
    if s.chars().count() <= MAX_LABEL_CHARS {
        return Cow::Owned(s);
    }
    // Still long: its start (the namespace) and its end (the function).
    let chars: Vec<char> = s.chars().collect();
    let head: String = chars[..MAX_LABEL_CHARS / 3].iter().collect();
    let tail: String = chars[chars.len() - (MAX_LABEL_CHARS * 2 / 3 - 1)..]
        .iter()
        .collect();
    Cow::Owned(format!("{head}…{tail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_lambda_reads_as_its_function() {
        let long = "void at::native::(anonymous namespace)::batch_norm_cpu_backward_contiguous_impl<float, float>(at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, bool, double)::{lambda(long, long)#1}::operator()(long, long) const";
        let s = short_label(long);
        assert_eq!(
            s,
            "void at::native::(anonymous namespace)::batch_norm_cpu_backward_contiguous_impl<…>(…)::{lambda#1}::operator()(…) const"
        );
    }

    #[test]
    fn short_names_and_operators_stay() {
        assert_eq!(short_label("deflate"), "deflate");
        let op = "c10::operator<<(std::basic_ostream<char, std::char_traits<char> >&, c10::TensorImpl const&) with a long tail to pass the threshold";
        let s = short_label(op);
        assert!(s.starts_with("c10::operator<<(…)"), "{s}");
    }

    #[test]
    fn any_name_fits_the_label_width() {
        let long = format!("ns::{}::leaf", "segment_".repeat(100));
        let s = short_label(&long);
        assert!(s.chars().count() <= MAX_LABEL_CHARS, "{s}");
        assert!(
            s.starts_with("ns::segment_") && s.ends_with("::leaf"),
            "{s}"
        );
        // Unbalanced brackets (a cut name) are not mangled further.
        let cut = format!("{}<int, (", "f".repeat(90));
        assert!(short_label(&cut).starts_with(&"f".repeat(50)));
    }
}
