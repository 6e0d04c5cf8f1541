//! Owner tokens and ids: every owner token a grant is made under, and every id of a hold, an
//! intent, a reservation or a latch generation, comes from here.

/// A fresh owner token, hex encoded (32 lowercase digits): `tag` (the client's 8 hex digits,
/// which the acquire script records for a waiter) then 96 random bits.
///
/// The bits come from rand's thread-local CSPRNG (ChaCha12, seeded from the OS and reseeded
/// by rand), not from a `getrandom` call per token; encoded on the stack, one allocation.
pub(crate) fn token(tag: &str) -> String {
    let mut buffer = uuid::Uuid::encode_buffer();
    let bits: u128 = rand::random();
    let token: &str = uuid::Uuid::from_u128(bits)
        .simple()
        .encode_lower(&mut buffer);
    let mut owner = String::with_capacity(32);
    owner.push_str(&tag[..tag.len().min(8)]);
    owner.push_str(&token[owner.len()..]);
    owner
}

/// A fresh random id (32 lowercase hex digits, 128 random bits): a re-entry's hold id, a
/// writer's intent, a semaphore waiter's reservation, a latch generation, a quorum lock's owner
/// (which no single client names).
pub(crate) fn id() -> String {
    let mut buffer = uuid::Uuid::encode_buffer();
    uuid::Uuid::from_u128(rand::random())
        .simple()
        .encode_lower(&mut buffer)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_are_a_tag_and_96_random_bits_in_hex() {
        let tag = "0a1b2c3d";
        let first = token(tag);
        assert_eq!(first.len(), 32);
        assert_eq!(first.capacity(), 32);
        assert!(first.starts_with(tag));
        assert!(first
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(first, token(tag));
        // Every bit after the tag varies: over 64 tokens each of the 96 bits was seen both set
        // and clear (chance of a false failure ≈ 2^-57).
        let (mut ones, mut zeros) = (0u128, 0u128);
        for _ in 0..64 {
            let bits = u128::from_str_radix(&token(tag), 16).unwrap();
            ones |= bits;
            zeros |= !bits;
        }
        let random = (1u128 << 96) - 1;
        assert_eq!((ones & random, zeros & random), (random, random));
    }

    #[test]
    fn ids_are_128_random_bits_in_hex() {
        let (a, b) = (id(), id());
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }
}
