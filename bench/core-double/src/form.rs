//! How core's HTTP servers read a request's parameters (core-side rules the double mirrors):
//! the form is URL-decoded as a whole, split at `&`, every `=` after the first of a pair and
//! every `?` dropped; base64 is decoded leniently, skipping any byte outside the alphabet.

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use stellar_xdr::{Limits, ReadXdr, WriteXdr};

use ledger_relay_wire::core_http::form_params;

/// Nesting depth allowed when decoding a key or an envelope from a request.
const XDR_DEPTH: u32 = 500;

/// The pairs of a decoded form or query string, in order, `?` removed as core's parser does.
pub fn params(decoded: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let clean: Vec<u8> = decoded.iter().copied().filter(|&c| c != b'?').collect();
    form_params(&clean)
        .into_iter()
        .map(|(n, v)| (n.to_vec(), v))
        .collect()
}

/// Every value of parameter `name`.
pub fn values<'a>(params: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Vec<&'a [u8]> {
    params
        .iter()
        .filter(|(n, _)| n == name.as_bytes())
        .map(|(_, v)| v.as_slice())
        .collect()
}

/// `v` as a form value a client sends core: its XDR in base64, with `+`, `/` and `=` escaped.
pub fn encode_xdr(v: &impl WriteXdr) -> Result<String, stellar_xdr::Error> {
    let text = base64::engine::general_purpose::STANDARD.encode(v.to_xdr(Limits::none())?);
    Ok(text
        .replace('+', "%2B")
        .replace('/', "%2F")
        .replace('=', "%3D"))
}

/// Base64 as core decodes it: bytes outside the alphabet (spaces from a `+` that was not
/// escaped, `=`, newlines) are skipped, and bits left over at the end are dropped.
pub fn lenient_base64(text: &[u8]) -> Vec<u8> {
    let alphabet = |c: &u8| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/';
    let mut clean: Vec<u8> = text.iter().copied().filter(alphabet).collect();
    if clean.len() % 4 == 1 {
        clean.pop();
    }
    let engine = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireNone),
    );
    // Only alphabet bytes remain and the length is not 1 mod 4: every such input decodes.
    engine.decode(&clean).unwrap_or_default()
}

/// Decodes XDR of type `T` from lenient base64, all bytes consumed.
pub fn xdr_from_base64<T: ReadXdr>(text: &[u8]) -> Result<T, stellar_xdr::Error> {
    let bytes = lenient_base64(text);
    T::from_xdr(
        &bytes,
        Limits {
            depth: XDR_DEPTH,
            len: bytes.len(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_skips_what_is_not_in_the_alphabet() {
        assert_eq!(lenient_base64(b"AAEC"), [0, 1, 2]);
        assert_eq!(lenient_base64(b"AA EC\n=="), [0, 1, 2]);
        // A `+` turned into a space by URL-decoding is lost, as in core.
        assert_eq!(lenient_base64(b"+/8="), [0xfb, 0xff]);
        assert_eq!(lenient_base64(b" /8="), [0xff]);
        // Bits left over are dropped.
        assert_eq!(lenient_base64(b"AAECA"), [0, 1, 2]);
        assert_eq!(lenient_base64(b"AAE"), [0, 1]);
        assert!(lenient_base64(b"").is_empty());
    }

    #[test]
    fn parameters_drop_question_marks_and_empty_pairs() {
        let p = params(b"?blob=AB==&x=&=y&blob=CD");
        assert_eq!(values(&p, "blob"), [b"AB".as_slice(), b"CD"]);
        assert!(values(&p, "x").is_empty());
    }
}
