// PLACEHOLDER: module header, replaced by the module family.
