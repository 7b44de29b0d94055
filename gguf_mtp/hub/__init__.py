"""The Hugging Face Hub transport: client glue (`client`), remote header reads (`remote`), checkpoint download."""
