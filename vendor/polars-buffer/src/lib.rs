pub mod buffer;
pub mod storage;

pub use buffer::Buffer;
pub use storage::SharedStorage;
