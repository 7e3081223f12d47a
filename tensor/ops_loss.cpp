// PLACEHOLDER: replaced by its op family.
