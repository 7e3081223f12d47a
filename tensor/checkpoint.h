// PLACEHOLDER: checkpoint header, replaced by the module family.
