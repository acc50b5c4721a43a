# An unknown flag must print the usage and exit non-zero.
execute_process(COMMAND ${PROGRAM} --no-such-flag RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(status EQUAL 0)
  message(FATAL_ERROR "longattn-info accepted --no-such-flag")
endif()
if(NOT err MATCHES "--no-such-flag" OR NOT err MATCHES "Usage:")
  message(FATAL_ERROR "expected the flag named and the usage on stderr, got: ${err}")
endif()
