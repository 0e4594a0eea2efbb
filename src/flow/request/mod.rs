//! One request, pure: its state ([`state`]) and one function per Envoy callback, each in the file of
//! its phase — request headers ([`headers`]), request body ([`body`]), callout answers and the order of
//! the admission steps ([`pipeline`], the steps in [`steps`]), the response ([`response`]), the end
//! ([`end`]). Refusals are data ([`denial`]); the texts of the answers are in [`answers`].

pub mod answers;
pub mod body;
pub mod denial;
pub mod end;
pub mod headers;
pub mod pipeline;
pub mod reservation;
pub mod response;
pub mod settlement;
pub mod state;
pub mod step;
pub mod steps;
