"""Operations: the verbs, each composed from the store, refs and object model."""
