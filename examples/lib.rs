//! Nothing here: the programs are the `[[example]]` targets of this package.
