//! The crate's one error type.

/// Why a Damgård–Jurik operation refused its input. Every variant is a property of the input
/// (outside bytes, a plaintext, a layer); none is a transient failure worth retrying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DjError {
    /// A layer outside `1..=MAX_LAYER` (or below 2 where a layer is to be peeled off).
    #[error("layer {layer} is outside the supported range {min}..={max}")]
    Layer {
        /// The layer asked for.
        layer: u32,
        /// The smallest layer the operation accepts.
        min: u32,
        /// The largest layer the operation accepts.
        max: u32,
    },
    /// Two ciphertexts of different layers were combined.
    #[error("ciphertexts of layers {left} and {right} cannot be combined")]
    LayerMismatch {
        /// The layer of the first operand.
        left: u32,
        /// The layer of the other operand.
        right: u32,
    },
    /// A plaintext (or exponent) is not below `n^s` for its layer `s`.
    #[error("plaintext does not lie in Z_(n^{layer})")]
    PlaintextRange {
        /// The layer whose plaintext space was exceeded.
        layer: u32,
    },
    /// Encoded bytes of the wrong length.
    #[error("{what}: expected {expected} bytes, got {got}")]
    Length {
        /// What was being decoded.
        what: &'static str,
        /// The length the encoding requires.
        expected: usize,
        /// The length supplied.
        got: usize,
    },
    /// A value that is not a ciphertext: not below `n^(s+1)`, or not a unit modulo `n`.
    #[error("malformed ciphertext at layer {layer}: {reason}")]
    Ciphertext {
        /// The layer the value was meant for.
        layer: u32,
        /// Which property failed.
        reason: &'static str,
    },
    /// A public or secret key encoding that is not a valid key.
    #[error("invalid key: {0}")]
    Key(&'static str),
    /// Vectors whose lengths must agree do not.
    #[error("{what}: {left} against {right} elements")]
    Shape {
        /// Which pair of inputs disagreed.
        what: &'static str,
        /// The first length.
        left: usize,
        /// The second length.
        right: usize,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = DjError> = std::result::Result<T, E>;
